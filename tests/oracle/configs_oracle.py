"""Configs of the families the oracle tests use (small pools, boundary-ish windows)."""

from __future__ import annotations

from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window

FAMILIES: dict[str, list[KVCacheConfig]] = {
    "full": [
        KVCacheConfig(24, (full_attention(4),), 120),
        KVCacheConfig(40, (full_attention(1),), 60),
    ],
    "sliding_window": [
        KVCacheConfig(24, (sliding_window(4, 7),), 120),
        KVCacheConfig(30, (sliding_window(2, 3),), 80),
    ],
    "chunked_local": [
        KVCacheConfig(24, (chunked_local(4, 8),), 120),
        KVCacheConfig(30, (chunked_local(2, 6),), 80),  # C % bs == 0: see test_oracle_findings.py
    ],
    "hybrid_equal": [
        KVCacheConfig(40, (full_attention(4), sliding_window(4, 5)), 120),
        KVCacheConfig(40, (full_attention(2), chunked_local(2, 6)), 80),
        KVCacheConfig(48, (full_attention(4), sliding_window(4, 5), chunked_local(4, 8)), 120),
    ],
}

ALL = [(f"{family}-{i}", c) for family, cs in FAMILIES.items() for i, c in enumerate(cs)]
