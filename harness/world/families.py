"""Config families: named Hypothesis strategies for ``KVCacheConfig`` (and the scheduler knobs).

Pools are small so that admission failures, eviction and preemption are common; block sizes,
windows, chunks and model lengths are drawn at and around block multiples, where managers break.

Each family is a config strategy registered with ``@family(name)`` (its docstring is its
one-line summary, ``REGISTRY[name].doc``); ``--family all`` runs them in registration order.

docs/families.md lists every spec input and the family that varies it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from hypothesis import strategies as st

from kvspec.spec.config import (
    AttentionSpec,
    KVCacheConfig,
    chunked_local,
    cross_attention,
    full_attention,
    sliding_window,
)
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.types import BlockCount, TokenCount

StrategyFn = TypeVar("StrategyFn", bound=Callable[..., Any])  # an st.composite function


@dataclass(frozen=True)
class Family:
    """A named family: ``strategy()`` draws its configs; ``features`` are the workload features it
    turns on (``harness.world.workload.draw_sched_config`` draws more for them); ``doc`` is one line."""

    name: str
    strategy: Callable[[], st.SearchStrategy[KVCacheConfig]]
    features: frozenset[str]
    doc: str


REGISTRY: dict[str, Family] = {}  # every family, in the order ``--family all`` runs them


def family(name: str, features: Collection[str] = ()) -> Callable[[StrategyFn], StrategyFn]:
    """Register a config strategy (an ``st.composite`` function, docstring = its one-line summary)
    as family ``name`` (docs/architecture.md, "Add a family")."""

    def register(fn: StrategyFn) -> StrategyFn:
        assert name not in REGISTRY, f"family {name!r} registered twice"
        summary = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        assert summary, f"family {name!r}: its strategy needs a docstring (its summary in docs/families.md)"
        REGISTRY[name] = Family(name, fn, frozenset(features), summary)
        return fn

    return register


def workload_features(family: str) -> frozenset[str]:
    """The workload features a family turns on (none for most)."""
    return REGISTRY[family].features


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


@family("full")
@st.composite
def _full(draw: st.DrawFn) -> KVCacheConfig:
    """One full-attention group."""
    bs = draw(st.sampled_from([1, 2, 4]))
    num_blocks, seq_blocks = draw(_pool(8))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), (full_attention(bs),), TokenCount(max(2, mml)))


@family("sliding_window")
@st.composite
def _sliding(draw: st.DrawFn) -> KVCacheConfig:
    """One sliding-window group."""
    bs = draw(st.sampled_from([1, 2, 4]))
    window = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), (sliding_window(bs, window),), TokenCount(max(2, mml)))


@family("chunked_local")
@st.composite
def _chunked(draw: st.DrawFn) -> KVCacheConfig:
    """One chunked-local-attention group."""
    bs = draw(st.sampled_from([1, 2, 4]))
    chunk = draw(near_multiples(bs, 1, 3 * bs + 1))
    num_blocks, seq_blocks = draw(_pool(10))
    mml = draw(near_multiples(bs, 2, seq_blocks * bs))
    return KVCacheConfig(BlockCount(num_blocks), (chunked_local(bs, chunk),), TokenCount(max(2, mml)))


@family("hybrid_equal")
@st.composite
def _hybrid_equal(draw: st.DrawFn) -> KVCacheConfig:
    """Full attention + sliding window (or chunked local), equal block sizes."""
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


@family("hybrid_diff")
@st.composite
def _hybrid_diff(draw: st.DrawFn) -> KVCacheConfig:
    """Full attention + sliding window with different block sizes (LCM alignment)."""
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


@family("hybrid_two_full")
@st.composite
def _hybrid_two_full(draw: st.DrawFn) -> KVCacheConfig:
    """Two full-attention groups of different block sizes (two spec groups) and a sliding-window
    group: the hybrid lookup's fixed point with more than one full-attention spec group."""
    small = draw(st.sampled_from([1, 2]))
    big = small * draw(st.sampled_from([2, 4]))
    fulls = (full_attention(small), full_attention(big))
    swa_bs = draw(st.sampled_from([small, big]))
    window = draw(near_multiples(swa_bs, 1, 2 * big + 1))
    groups = (*(fulls if draw(st.booleans()) else fulls[::-1]), sliding_window(swa_bs, window))
    num_blocks, seq_blocks = draw(_pool(5))
    num_blocks = 1 + 4 * (num_blocks - 1)
    mml = draw(near_multiples(big, 2, seq_blocks * big))
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(max(2, mml)))


@family("no_cache")
@st.composite
def _no_cache(draw: st.DrawFn) -> KVCacheConfig:
    """Prefix caching off (any of the first four layouts)."""
    base = draw(st.one_of(_full(), _sliding(), _chunked(), _hybrid_equal()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_caching=False)


@family("events")
@st.composite
def _events(draw: st.DrawFn) -> KVCacheConfig:
    """KV-cache events on (full or sliding window), drained every step."""
    base = draw(st.one_of(_full(), _sliding()))
    return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_kv_cache_events=True)


def _any_layout() -> st.SearchStrategy[KVCacheConfig]:
    """Every caching layout of the first five families."""
    return st.one_of(_full(), _sliding(), _chunked(), _hybrid_equal(), _hybrid_diff())


@family("cbor")
@st.composite
def _cbor(draw: st.DrawFn) -> KVCacheConfig:
    """Any layout hashed with ``sha256_cbor`` (events on half of the time)."""
    base = draw(_any_layout())
    return replace(base, hash_algo="sha256_cbor", enable_kv_cache_events=draw(st.booleans()))


@family("encoder_decoder", features={"encoder_decoder"})
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


@family("v0_20")
@st.composite
def _v0_20(draw: st.DrawFn) -> KVCacheConfig:
    """Any layout under the 0.20 free-queue order (``spec.releases.line.FREE_ORDER_0_20``)."""
    base = draw(_any_layout())
    return replace(base, profile=FREE_ORDER_0_20, enable_caching=draw(st.integers(0, 3)) != 0)


@family("async_sched", features={"async_scheduling"})
@st.composite
def _async_sched(draw: st.DrawFn) -> KVCacheConfig:
    """Async scheduling: two batches in flight, so ``max_in_flight_tokens`` is twice the budget."""
    base = draw(_any_layout())
    bs = base.scheduler_block_size
    budget = draw(near_multiples(bs, 1, 4 * bs + 1))
    return replace(base, max_in_flight_tokens=TokenCount(2 * budget))


@family("hash_block_override")
@st.composite
def _hash_block_override(draw: st.DrawFn) -> KVCacheConfig:
    """A hybrid layout (vLLM 0.33 requires hash_block_size == block_size for one group) hashed in
    blocks of a proper divisor of the groups' GCD."""
    base = draw(st.one_of(_hybrid_equal(), _hybrid_diff()).filter(lambda c: c.hash_block_size > 1))
    hbs = base.hash_block_size
    override = draw(st.sampled_from([d for d in range(1, hbs) if hbs % d == 0]))
    return replace(base, hash_block_size_override=TokenCount(override), enable_kv_cache_events=draw(st.booleans()))


@family("prompt_embeds", features={"prompt_embeds"})
@st.composite
def _prompt_embeds(draw: st.DrawFn) -> KVCacheConfig:
    """Requests may carry prompt embeddings instead of token ids."""
    return draw(st.one_of(_full(), _sliding(), _hybrid_equal()))


@family("request_keys", features={"request_keys"})
@st.composite
def _request_keys(draw: st.DrawFn) -> KVCacheConfig:
    """LoRA adapters sharing a name, salts equal to adapter names, images in the prompt's tail and
    next turns of conversations: the inputs older releases' block keys could not tell apart.  Mostly
    full attention in blocks of 4 or 8, so that two images fit in a prompt's unfinished block."""
    bs = draw(st.sampled_from([4, 8]))
    num_blocks, seq_blocks = draw(_pool(6))
    full = KVCacheConfig(
        BlockCount(num_blocks), (full_attention(bs),), TokenCount(draw(near_multiples(bs, 2, seq_blocks * bs)))
    )
    if draw(st.integers(0, 3)):
        return full
    return draw(st.one_of(_sliding(), _hybrid_equal()))


@family("engine_defaults")
@st.composite
def _engine_defaults(draw: st.DrawFn) -> KVCacheConfig:
    """What vLLM's engine builds for a full, sliding-window or hybrid model (``harness/engine``: a
    Llama, a Mistral, a Gemma 2), dense retention: one block size for every group, a hybrid's
    sliding-window group first (its first layer's), caching on, and a synchronous scheduler's budget
    (``max_num_batched_tokens``) as ``max_in_flight_tokens``, which the other families leave ``None``."""
    bs = draw(st.sampled_from([1, 2, 4]))
    window = draw(near_multiples(bs, 1, 3 * bs + 1))
    groups = draw(
        st.sampled_from(
            [(full_attention(bs),), (sliding_window(bs, window),), (sliding_window(bs, window), full_attention(bs))]
        )
    )
    num_blocks, seq_blocks = draw(_pool(8))
    num_blocks = 1 + (num_blocks - 1) * len(groups)
    mml = max(2, draw(near_multiples(bs, 2, seq_blocks * bs)))
    budget = draw(near_multiples(bs, 1, max(mml, 4 * bs + 1)))
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(mml), max_in_flight_tokens=TokenCount(budget))


FAMILIES = tuple(REGISTRY)  # the built-in families


@functools.cache
def configs(family: str) -> st.SearchStrategy[KVCacheConfig]:
    """The family's configs, validated (built once per family: Hypothesis validates a strategy the
    first time it draws from it, and that cost would come back with every example)."""
    try:
        strategy = REGISTRY[family].strategy()
    except KeyError:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(REGISTRY)})") from None
    return strategy.map(lambda c: c.validate())


def parse_families(text: str) -> list[str]:
    """``--family`` value: ``all`` or a comma-separated list of family names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--family needs at least one family name or 'all'")
    if names == ["all"]:
        return list(REGISTRY)
    bad = [n for n in names if n not in REGISTRY]
    if bad:
        hint = did_you_mean(bad[0], [*REGISTRY, "all"])
        raise ValueError(f"unknown family {', '.join(bad)}{hint} (known: {', '.join(REGISTRY)}, all)")
    return names


def did_you_mean(name: str, known: Collection[str]) -> str:
    """``"; did you mean X?"`` for the known name closest to ``name`` (a typo, another spelling:
    ``slidingwindow``, ``Sliding-Window``), or ``""`` when none is close."""
    import difflib

    def norm(s: str) -> str:
        return s.lower().replace("-", "").replace("_", "")

    by_norm = {norm(k): k for k in known}
    if norm(name) in by_norm:
        return f"; did you mean {by_norm[norm(name)]}?"
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
