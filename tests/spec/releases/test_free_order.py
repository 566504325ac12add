"""The free-queue order across vLLM releases (spec.releases Changes on the block pool's knobs).

Each scenario runs on the spec under ``profile_for(change.release)`` and under the release before
it; the expected block ids and queue orders were observed on the real releases (the vllm target
with vLLM 0.23.0, 0.24.0, 0.26.0, 0.27.0, 0.27.1 and 0.28.0 installed: the same operations
returned the same outcomes there).  Flipping any of the knobs back fails these tests.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvspec.spec.config import AttentionSpec, KVCacheConfig, chunked_local, full_attention, sliding_window
from kvspec.spec.invariants import StepContext, check_invariants, check_step
from kvspec.spec.kv_cache_manager import (
    allocate_slots,
    free,
    get_computed_blocks,
    init_kv_cache_manager,
    remove_skipped_blocks,
)
from kvspec.spec.releases.line import CHANGES, profile_for
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import Request, make_request
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import RequestId

CHANGE = {c.name: c for c in CHANGES}


def config(groups: list[AttentionSpec], num_blocks: int, **kw: object) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=num_blocks, groups=tuple(groups), **kw)  # type: ignore[arg-type]


def admit(state: KVCacheManagerState, req: Request) -> tuple[KVCacheManagerState, object, object, object]:
    """The scheduler's admission: lookup, then allocate the rest of the prompt."""
    hit = get_computed_blocks(state, req)
    state, new = allocate_slots(state, req, req.num_tokens - hit.num_hit_tokens, hit.num_hit_tokens, hit)
    return state, req, hit, new


def free_then_reuse(profile: Profile, group: AttentionSpec, caching: bool, num_blocks: int = 8) -> tuple:
    """Admit r1 (6 tokens: one full block, one partial), free it, admit r2 (4 other tokens):
    the queue after the free and r2's block."""
    cfg = config([group], num_blocks, max_model_len=64, enable_caching=caching, profile=profile)
    state = init_kv_cache_manager(cfg)
    state, _, _, new = admit(state, make_request("r1", tuple(range(1, 7)), cfg))
    assert new == ((1, 2),)
    state = free(state, "r1")
    queue = tuple(state.pool.free_queue)
    state, _, _, new = admit(state, make_request("r2", (50, 51, 52, 53), cfg))
    assert new is not None
    return queue, new[0]


def skip_window(profile: Profile, caching: bool) -> tuple[int, ...]:
    """Sliding window 4 (4-token blocks): 12 tokens computed, then ``remove_skipped_blocks`` frees
    the two blocks before the window; the queue after it."""
    cfg = config([sliding_window(4, 4)], 8, max_model_len=64, enable_caching=caching, profile=profile)
    state = init_kv_cache_manager(cfg)
    state, _, _, new = admit(state, make_request("r1", tuple(range(1, 13)), cfg))
    assert new == ((1, 2, 3),)
    return tuple(remove_skipped_blocks(state, "r1", 12).pool.free_queue)


# --- 0.24.0: free splits for every manager ------------------------------------------------------------


def test_free_queue_split_for_every_manager() -> None:
    """Change ``free_queue_split_for_every_manager``: in 0.23 ``free`` of a full-attention (or chunked
    local) group appended the request's unhashed partial block behind the free ones, so the next
    request got block 3; from 0.24 it is prepended and reused first (block 2)."""
    change = CHANGE["free_queue_split_for_every_manager"]
    v023, v024 = profile_for("0.23.0"), profile_for(change.release)
    assert (v023.finish_free_order, v024.finish_free_order) == (change.before, change.after)
    for group in (full_attention(4), chunked_local(4, 8)):
        assert free_then_reuse(v023, group, True) == ((3, 4, 5, 6, 7, 2, 1), (3,))
        assert free_then_reuse(v024, group, True) == ((2, 3, 4, 5, 6, 7, 1), (2,))
    # Caching off: 0.23 appends for full attention, 0.24 prepends (everything is unhashed).
    assert free_then_reuse(v023, full_attention(4), False) == ((3, 4, 5, 6, 7, 2, 1), (3,))
    assert free_then_reuse(v024, full_attention(4), False) == ((2, 1, 3, 4, 5, 6, 7), (2,))


def test_sliding_window_free_and_skipped_blocks_split_in_0_23_already() -> None:
    """0.23's ``SlidingWindowManager.free`` and ``remove_skipped_blocks`` split like 0.24's pool."""
    for version in ("0.23.0", "0.24.0"):
        profile = profile_for(version)
        assert free_then_reuse(profile, sliding_window(4, 4), True) == ((2, 3, 4, 5, 6, 7, 1), (2,))
        assert free_then_reuse(profile, sliding_window(4, 4), False) == ((2, 1, 3, 4, 5, 6, 7), (2,))
        assert skip_window(profile, True) == (4, 5, 6, 7, 2, 1)  # hashed: to the tail
        assert skip_window(profile, False) == (2, 1, 4, 5, 6, 7)


def test_two_requests_freed_under_0_23_and_0_24() -> None:
    """r1 and r2 (6 distinct tokens each) freed in turn: 0.23 queues [5,6,7, 2,1, 4,3] (each
    request tail first, all appended), 0.24 [4,2, 5,6,7, 1,3] (partial blocks at the front)."""
    expected = {"0.23.0": (5, 6, 7, 2, 1, 4, 3), "0.24.0": (4, 2, 5, 6, 7, 1, 3)}
    for version, queue in expected.items():
        cfg = config([full_attention(4)], 8, max_model_len=64, profile=profile_for(version))
        state = init_kv_cache_manager(cfg)
        state, *_ = admit(state, make_request("r1", tuple(range(1, 7)), cfg))
        state, *_ = admit(state, make_request("r2", tuple(range(101, 107)), cfg))
        state = free(free(state, "r1"), "r2")
        assert tuple(state.pool.free_queue) == queue


# --- 0.27.0 / 0.28.0: caching off ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change_name", "older", "newer", "older_queue", "newer_queue"),
    [
        ("free_order_with_caching_disabled", "0.26.0", "0.27.0", (2, 1, 3, 4), (3, 4, 2, 1)),
        ("free_order_caching_disabled_lifo", "0.27.1", "0.28.0", (3, 4, 2, 1), (2, 1, 3, 4)),
    ],
)
def test_caching_off_free_order(
    change_name: str, older: str, newer: str, older_queue: tuple, newer_queue: tuple
) -> None:
    """Changes ``free_order_with_caching_disabled`` (0.27: caching off appends, FIFO reuse) and
    ``free_order_caching_disabled_lifo`` (0.28: back to the front).  One full group, 4 usable blocks,
    caching off: r1 (8 tokens) gets [1, 2] and is freed tail first; r2 then gets the queue's head."""
    change = CHANGE[change_name]
    assert change.release == newer
    before, after = profile_for(older), profile_for(newer)
    assert (before.caching_off_free_order, after.caching_off_free_order) == (change.before, change.after)
    for profile, queue in ((before, older_queue), (after, newer_queue)):
        cfg = config([full_attention(4)], 5, max_model_len=64, enable_caching=False, profile=profile)
        state = init_kv_cache_manager(cfg)
        state, _, _, new = admit(state, make_request("r1", tuple(range(1, 9)), cfg))
        assert new == ((1, 2),)
        state = free(state, "r1")
        assert tuple(state.pool.free_queue) == queue
        state, _, _, new = admit(state, make_request("r2", (50, 51, 52, 53), cfg))
        assert new == ((queue[0],),)


def test_caching_off_free_order_covers_every_free_path() -> None:
    """0.27.x appends with caching off on every path (sliding window's free, skipped blocks); with
    caching on it splits as before."""
    v026, v027, v028 = (profile_for(v) for v in ("0.26.0", "0.27.0", "0.28.0"))
    assert free_then_reuse(v027, sliding_window(4, 4), False) == ((3, 4, 5, 6, 7, 2, 1), (3,))
    assert skip_window(v027, False) == (4, 5, 6, 7, 2, 1)
    for profile in (v026, v028):
        assert free_then_reuse(profile, sliding_window(4, 4), False) == ((2, 1, 3, 4, 5, 6, 7), (2,))
        assert skip_window(profile, False) == (2, 1, 4, 5, 6, 7)
    assert free_then_reuse(v027, full_attention(4), True) == ((2, 3, 4, 5, 6, 7, 1), (2,))


# --- the release line applies knobs changed twice -----------------------------------------------------


def test_a_knob_changed_twice_takes_the_newest_change_made() -> None:
    """0.27 sets ``caching_off_free_order`` and 0.28 restores it: releases before 0.27 keep the first
    change's ``before``, 0.27.x the 0.27 ``after``, 0.28 on the 0.28 ``after``."""
    values = {v: profile_for(v).caching_off_free_order for v in ("0.23.0", "0.24.0", "0.26.0", "0.27.0")}
    values |= {v: profile_for(v).caching_off_free_order for v in ("0.27.1", "0.28.0", "0.33.0", "0.34.0")}
    assert values == {
        "0.23.0": "front",
        "0.24.0": "front",
        "0.26.0": "front",
        "0.27.0": "tail",
        "0.27.1": "tail",
        "0.28.0": "front",
        "0.33.0": "front",
        "0.34.0": "front",
    }


def test_what_if_0_20_profile_appends_regardless() -> None:
    """The 0.20 what-if profile (``free_order == "append"``) appends on every path."""
    profile = replace(profile_for("0.33.0"), free_order="append")
    assert free_then_reuse(profile, sliding_window(4, 4), True) == ((3, 4, 5, 6, 7, 2, 1), (3,))
    assert free_then_reuse(profile, full_attention(4), False) == ((3, 4, 5, 6, 7, 2, 1), (3,))


# --- the invariants follow the knobs ------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.23.0", "0.24.0", "0.27.0", "0.28.0"])
@pytest.mark.parametrize("caching", [True, False])
def test_free_order_invariants_hold_under_each_profile(version: str, caching: bool) -> None:
    """A hybrid (full + sliding window) request freed under each free-queue profile: the ``free_order``
    step postcondition and the state invariants (``free_queue_partition`` among them) agree with the
    spec, and the step postcondition fails on the queue of the profile before the change."""
    profile = profile_for(version)
    cfg = config(
        [full_attention(4), sliding_window(4, 4)], 12, max_model_len=64, enable_caching=caching, profile=profile
    )
    state = init_kv_cache_manager(cfg)
    state, r1, _, _ = admit(state, make_request("r1", tuple(range(1, 7)), cfg))
    state, r2, _, _ = admit(state, make_request("r2", tuple(range(101, 107)), cfg))
    after = free(state, "r1")
    ctx = StepContext(state, after, "free", {"request_id": "r1"}, None, None)
    assert check_step(ctx, ["free_order"]) == []
    assert check_invariants(after, {RequestId("r2"): r2}) == []
    other = {"0.23.0": "0.24.0", "0.24.0": "0.23.0", "0.27.0": "0.28.0", "0.28.0": "0.27.0"}[version]
    if version in ("0.23.0", "0.24.0") or not caching:
        theirs = profile_for(other)
        wrong = free(
            replace(state, config=replace(cfg, profile=theirs), pool=replace(state.pool, profile=theirs)), "r1"
        )
        wrong_ctx = StepContext(
            state,
            replace(after, pool=replace(after.pool, free_queue=wrong.pool.free_queue)),
            "free",
            {"request_id": "r1"},
            None,
            None,
        )
        assert [v.name for v in check_step(wrong_ctx, ["free_order"])] == ["free_order"]
