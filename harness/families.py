"""Config families: named Hypothesis strategies for ``KVCacheConfig`` (and the scheduler knobs).

Pools are small so that admission failures, eviction and preemption are common; block sizes,
windows, chunks and model lengths are drawn at and around block multiples, where managers break.

- ``full``: one full-attention group;
- ``sliding_window``: one sliding-window group;
- ``chunked_local``: one chunked-local-attention group;
- ``hybrid_equal``: full attention + sliding window (or chunked local), equal block sizes;
- ``hybrid_diff``: full attention + sliding window with different block sizes (LCM alignment);
- ``no_cache``: prefix caching off (any of the above layouts);
- ``events``: KV-cache events on (full or sliding window), drained every step.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window

FAMILIES = ("full", "sliding_window", "chunked_local", "hybrid_equal", "hybrid_diff", "no_cache", "events")


def near_multiples(m: int, lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in ``[lo, hi]``, half of the time at or next to a multiple of ``m``."""
    hi = max(lo, hi)
    points = sorted({x for k in range(0, hi // max(m, 1) + 2) for x in (k * m - 1, k * m, k * m + 1) if lo <= x <= hi})
    if not points:
        return st.integers(lo, hi)
    return st.one_of(st.sampled_from(points), st.integers(lo, hi))


@st.composite
def _pool(draw: st.DrawFn, blocks_per_seq: int) -> tuple[int, int]:
    """(num_blocks, max_model_len in blocks): a pool that holds one to two full sequences."""
    seq_blocks = draw(st.integers(2, max(2, blocks_per_seq)))
    num_blocks = 1 + draw(st.integers(seq_blocks, 2 * seq_blocks + 1))
    return num_blocks, seq_blocks


@st.composite
def _full(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    num_blocks, seq_blocks = draw(_pool(8))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(num_blocks, (full_attention(bs),), max(2, mml))


@st.composite
def _sliding(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    window = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(num_blocks, (sliding_window(bs, window),), max(2, mml))


@st.composite
def _chunked(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    chunk = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(num_blocks, (chunked_local(bs, chunk),), max(2, mml))


@st.composite
def _hybrid_equal(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        other = sliding_window(bs, draw(near_multiples(bs, 1, 3 * bs + 1)))
    else:
        other = chunked_local(bs, draw(near_multiples(bs, 1, 3 * bs + 1)))
    groups = (full_attention(bs), other) + ((other,) if draw(st.integers(0, 3)) == 0 else ())
    num_blocks, seq_blocks = draw(_pool(6))
    num_blocks = 1 + (num_blocks - 1) * len(groups)
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(num_blocks, groups, max(2, mml))


@st.composite
def _hybrid_diff(draw: st.DrawFn) -> KVCacheConfig:
    small = draw(st.sampled_from([1, 2]))
    big = small * draw(st.sampled_from([2, 4]))
    fa_bs, swa_bs = (big, small) if draw(st.booleans()) else (small, big)
    window = draw(near_multiples(swa_bs, 1, 2 * big + 1))
    lcm = big
    num_blocks, seq_blocks = draw(_pool(5))
    num_blocks = 1 + 3 * (num_blocks - 1)
    mml = draw(near_multiples(lcm, 2, seq_blocks * lcm))
    return KVCacheConfig(num_blocks, (full_attention(fa_bs), sliding_window(swa_bs, window)), max(2, mml))


@st.composite
def _no_cache(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(st.one_of(_full(), _sliding(), _chunked(), _hybrid_equal()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_caching=False)


@st.composite
def _events(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(st.one_of(_full(), _sliding()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_kv_cache_events=True)


STRATEGIES = {
    "full": _full,
    "sliding_window": _sliding,
    "chunked_local": _chunked,
    "hybrid_equal": _hybrid_equal,
    "hybrid_diff": _hybrid_diff,
    "no_cache": _no_cache,
    "events": _events,
}


def configs(family: str, kv_safe: bool = False) -> st.SearchStrategy[KVCacheConfig]:
    """The family's configs; ``kv_safe`` (under ``--kv-check``) rounds chunk sizes up to block
    multiples, see ``round_chunks_to_blocks``."""
    try:
        strategy = STRATEGIES[family]()
    except KeyError:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})") from None
    if kv_safe:
        strategy = strategy.map(round_chunks_to_blocks)
    return strategy.map(lambda c: c.validate())


def round_chunks_to_blocks(config: KVCacheConfig) -> KVCacheConfig:
    """vLLM 0.33 computes wrong numbers for chunked-local attention whose chunk is not a multiple of
    the block size (the lookup counts the nulls before the chunk as a hit, yet the next query's
    chunk reaches into them: a finding the KV oracle reports at once, documented in
    docs/findings.md).  Allocation fuzzing keeps such chunks; the KV check rounds them up so it
    can look for other bugs."""
    groups = tuple(
        replace(g, attention_chunk_size=-(-g.attention_chunk_size // g.block_size) * g.block_size)
        if g.kind == "chunked_local" and g.attention_chunk_size is not None
        else g
        for g in config.groups
    )
    return replace(config, groups=groups)


def parse_families(text: str) -> list[str]:
    """``--family`` value: ``all`` or a comma-separated list of family names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--family needs at least one family name or 'all'")
    if names == ["all"]:
        return list(FAMILIES)
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise ValueError(f"unknown family {', '.join(bad)} (known: {', '.join(FAMILIES)}, all)")
    return names
