"""Differential smoke test: kvspec's impl allocator vs the real vLLM 0.33 KVCacheManager.

Both targets replay the same generated scheduler traces; every outcome and every observation
(tables, cached counts, ref counts, free-queue order, block keys, hash map, request hashes) must
be identical.  Skipped when vLLM is not installed.
"""

from __future__ import annotations

import pytest
from difftools import run_both

from kvspec.spec.config import KVCacheConfig, chunked_local, cross_attention, full_attention, sliding_window

pytestmark = pytest.mark.vllm

CONFIGS = {
    "full": KVCacheConfig(num_blocks=24, groups=(full_attention(4),), max_model_len=200, enable_kv_cache_events=True),
    "sliding_window": KVCacheConfig(
        num_blocks=24, groups=(sliding_window(4, 7),), max_model_len=200, enable_kv_cache_events=True
    ),
    "chunked_local": KVCacheConfig(
        num_blocks=24, groups=(chunked_local(4, 8),), max_model_len=200, enable_kv_cache_events=True
    ),
    "hybrid_lcm": KVCacheConfig(
        num_blocks=40,
        groups=(full_attention(16), sliding_window(4, 9)),
        max_model_len=300,
        enable_kv_cache_events=True,
        hash_algo="sha256_cbor",
    ),
    "hybrid_three": KVCacheConfig(
        num_blocks=40,
        groups=(sliding_window(4, 5), full_attention(4), chunked_local(4, 8)),
        max_model_len=200,
        enable_kv_cache_events=True,
        watermark=0.1,
        max_in_flight_tokens=8,
    ),
    "no_cache_cross": KVCacheConfig(
        num_blocks=30, groups=(full_attention(4), cross_attention(4)), max_model_len=200, enable_caching=False
    ),
}


@pytest.fixture(scope="module")
def vllm_target():
    try:
        from kvspec.harness.targets.vllm import VllmTarget, VllmUnavailable
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"kvspec.harness.targets.vllm unavailable: {e}")
    try:
        return VllmTarget()
    except VllmUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_impl_matches_vllm(vllm_target, family):
    from kvspec.harness.targets.impl import ImplTarget

    total = 0
    for seed in range(2):
        n, err = run_both(ImplTarget(), vllm_target, CONFIGS[family], seed, 250)
        assert err is None, err
        total += n
    assert total > 300
