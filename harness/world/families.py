"""Config families: named Hypothesis strategies for ``KVCacheConfig`` (and the scheduler knobs).

Pools are small so that admission failures, eviction and preemption are common; block sizes,
windows, chunks and model lengths are drawn at and around block multiples, where managers break.

- ``full``: one full-attention group;
- ``sliding_window``: one sliding-window group;
- ``chunked_local``: one chunked-local-attention group;
- ``hybrid_equal``: full attention + sliding window (or chunked local), equal block sizes;
- ``hybrid_diff``: full attention + sliding window with different block sizes (LCM alignment);
- ``no_cache``: prefix caching off (any of the above layouts);
- ``events``: KV-cache events on (full or sliding window), drained every step;
- ``cbor``: any layout hashed with ``sha256_cbor`` (events on half of the time);
- ``encoder_decoder``: decoder group(s) and a cross-attention group, caching off (vLLM 0.33 cannot
  cache cross attention); every request has an encoder input, passed as ``num_encoder_tokens``;
- ``v0_20``: any layout under the 0.20 free-queue order (``Profile.V0_20``; vLLM 0.33 is
  ``Unsupported`` there, so it runs against spec / impl / user targets);
- ``async_sched``: async scheduling, ``max_in_flight_tokens = 2 * budget`` (window admission caps)
  and requests with tokens in flight (``SetNumInFlightTokens``);
- ``hash_block_override``: a hybrid layout hashed in blocks smaller than its groups' GCD;
- ``prompt_embeds``: requests may carry prompt embeddings instead of token ids.

docs/families.md lists every spec input and the family that varies it.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from spec.config import (
    AttentionSpec,
    KVCacheConfig,
    Profile,
    chunked_local,
    cross_attention,
    full_attention,
    sliding_window,
)
from spec.types import BlockCount, TokenCount

FAMILIES = (
    "full",
    "sliding_window",
    "chunked_local",
    "hybrid_equal",
    "hybrid_diff",
    "no_cache",
    "events",
    "cbor",
    "encoder_decoder",
    "v0_20",
    "async_sched",
    "hash_block_override",
    "prompt_embeds",
)

# Families whose workload draws more than the config shows (``harness.world.workload.draw_sched_config``).
WORKLOAD_FEATURES: dict[str, frozenset[str]] = {
    "encoder_decoder": frozenset({"encoder_decoder"}),
    "async_sched": frozenset({"async_scheduling"}),
    "prompt_embeds": frozenset({"prompt_embeds"}),
}


def workload_features(family: str) -> frozenset[str]:
    """The workload features a family turns on (none for most)."""
    return WORKLOAD_FEATURES.get(family, frozenset())


def near_multiples(m: int, lo: int, hi: int) -> st.SearchStrategy[int]:
    """Integers in ``[lo, hi]``, half of the time at or next to a multiple of ``m``."""
    points = near_points(m, lo, hi)
    if not points:
        return st.integers(lo, max(lo, hi))
    return st.one_of(st.sampled_from(points), st.integers(lo, max(lo, hi)))


@functools.lru_cache(maxsize=4096)
def near_points(m: int, lo: int, hi: int) -> tuple[int, ...]:
    """The integers in ``[lo, hi]`` at or next to a multiple of ``m``, sorted."""
    hi = max(lo, hi)
    near = {x for k in range(hi // max(m, 1) + 2) for x in (k * m - 1, k * m, k * m + 1)}
    return tuple(sorted(x for x in near if lo <= x <= hi))


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
    return KVCacheConfig(BlockCount(num_blocks), (full_attention(bs),), TokenCount(max(2, mml)))


@st.composite
def _sliding(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    window = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), (sliding_window(bs, window),), TokenCount(max(2, mml)))


@st.composite
def _chunked(draw: st.DrawFn) -> KVCacheConfig:
    bs = draw(st.sampled_from([1, 2, 4]))
    chunk = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), (chunked_local(bs, chunk),), TokenCount(max(2, mml)))


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
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(max(2, mml)))


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
    return KVCacheConfig(
        BlockCount(num_blocks), (full_attention(fa_bs), sliding_window(swa_bs, window)), TokenCount(max(2, mml))
    )


@st.composite
def _no_cache(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(st.one_of(_full(), _sliding(), _chunked(), _hybrid_equal()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_caching=False)


@st.composite
def _events(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(st.one_of(_full(), _sliding()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_kv_cache_events=True)


def _any_layout() -> st.SearchStrategy[KVCacheConfig]:
    """Every caching layout of the first five families."""
    return st.one_of(_full(), _sliding(), _chunked(), _hybrid_equal(), _hybrid_diff())


@st.composite
def _cbor(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(_any_layout())
    return replace(base, hash_algo="sha256_cbor", enable_kv_cache_events=draw(st.booleans()))


@st.composite
def _encoder_decoder(draw: st.DrawFn) -> KVCacheConfig:
    """Whisper-like: full attention (maybe with a sliding-window group) plus cross attention, all
    of one block size, caching off (vLLM 0.33 ``CrossAttentionManager`` cannot cache)."""
    bs = draw(st.sampled_from([1, 2, 4]))
    decoder: tuple[AttentionSpec, ...] = (full_attention(bs),)
    if draw(st.integers(0, 2)) == 0:
        decoder += (sliding_window(bs, draw(near_multiples(bs, 1, 3 * bs + 1))),)
    cross = cross_attention(bs)
    groups = (cross, *decoder) if draw(st.booleans()) else (*decoder, cross)
    num_blocks, seq_blocks = draw(_pool(6))
    num_blocks = 1 + (num_blocks - 1) * len(groups)
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(max(2, mml)), enable_caching=False)


@st.composite
def _v0_20(draw: st.DrawFn) -> KVCacheConfig:
    base = draw(_any_layout())
    return replace(base, profile=Profile.V0_20, enable_caching=draw(st.integers(0, 3)) != 0)


@st.composite
def _async_sched(draw: st.DrawFn) -> KVCacheConfig:
    """Async scheduling: two batches in flight, so ``max_in_flight_tokens`` is twice the budget."""
    base = draw(_any_layout())
    bs = base.scheduler_block_size
    budget = draw(near_multiples(bs, 1, 4 * bs + 1))
    return replace(base, max_in_flight_tokens=TokenCount(2 * budget))


@st.composite
def _hash_block_override(draw: st.DrawFn) -> KVCacheConfig:
    """A hybrid layout (vLLM 0.33 requires hash_block_size == block_size for one group) hashed in
    blocks of a proper divisor of the groups' GCD."""
    base = draw(st.one_of(_hybrid_equal(), _hybrid_diff()).filter(lambda c: c.hash_block_size > 1))
    hbs = base.hash_block_size
    override = draw(st.sampled_from([d for d in range(1, hbs) if hbs % d == 0]))
    return replace(base, hash_block_size_override=TokenCount(override), enable_kv_cache_events=draw(st.booleans()))


@st.composite
def _prompt_embeds(draw: st.DrawFn) -> KVCacheConfig:
    return draw(st.one_of(_full(), _sliding(), _hybrid_equal()))


STRATEGIES = {
    "full": _full,
    "sliding_window": _sliding,
    "chunked_local": _chunked,
    "hybrid_equal": _hybrid_equal,
    "hybrid_diff": _hybrid_diff,
    "no_cache": _no_cache,
    "events": _events,
    "cbor": _cbor,
    "encoder_decoder": _encoder_decoder,
    "v0_20": _v0_20,
    "async_sched": _async_sched,
    "hash_block_override": _hash_block_override,
    "prompt_embeds": _prompt_embeds,
}


def configs(family: str) -> st.SearchStrategy[KVCacheConfig]:
    """The family's configs, validated."""
    try:
        strategy = STRATEGIES[family]()
    except KeyError:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})") from None
    return strategy.map(lambda c: c.validate())


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
