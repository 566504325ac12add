"""The unmutated managers pass the ledger: seeded workload runs on every layout are clean with the
workload's trigger steering on, and with it off every finding is one of the three vLLM 0.33
candidate bugs of docs/findings.md; the Hypothesis state machine (ledger on by default) agrees."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from ledger_cases import drive, is_known_vllm_trigger

from harness.families import FAMILIES
from harness.machine import RunStats, make_machine, run_machine
from harness.profiles import profile_settings
from harness.targets.impl import ImplTarget
from harness.targets.spec import SpecTarget
from spec.config import KVCacheConfig, chunked_local, cross_attention, full_attention, sliding_window

FULL = KVCacheConfig(24, (full_attention(4),), 120)
SWA = KVCacheConfig(24, (sliding_window(4, 7),), 120)
LAYOUTS = {
    "full": FULL,
    "full-bs1": KVCacheConfig(40, (full_attention(1),), 60),
    "sliding_window": SWA,
    "sliding_window-small": KVCacheConfig(30, (sliding_window(2, 3),), 80),
    "chunked_local": KVCacheConfig(24, (chunked_local(4, 8),), 120),
    "chunked_local-odd": KVCacheConfig(30, (chunked_local(2, 5),), 80),  # candidate bug 1 whatever the steering
    "chunked_local-bs1": KVCacheConfig(30, (chunked_local(1, 2),), 40),  # whole-prompt loads end chunks often
    "hybrid_equal": KVCacheConfig(48, (full_attention(4), sliding_window(4, 5), chunked_local(4, 8)), 120),
    "hybrid_diff": KVCacheConfig(60, (full_attention(4), sliding_window(2, 5)), 80),
    "hybrid_diff-big-window": KVCacheConfig(60, (full_attention(2), sliding_window(4, 9)), 80),
    "no_cache": replace(SWA, enable_caching=False),
    "events": replace(FULL, enable_kv_cache_events=True),
    "encoder_decoder": KVCacheConfig(40, (full_attention(2), cross_attention(2)), 40, enable_caching=False),
    "async_sched": replace(FULL, max_in_flight_tokens=10),
    "async_sched-window": replace(SWA, max_in_flight_tokens=6),
}
FEATURES = {"full": frozenset({"prompt_embeds"})}  # embeddings prompts, on one layout
SEEDS = range(4)
ACTIONS = 250


@pytest.mark.parametrize("inner", [SpecTarget, ImplTarget])
@pytest.mark.parametrize(
    "layout", sorted(set(LAYOUTS) - {"chunked_local-odd"})
)  # candidate bug 1 whatever the steering
def test_seeded_runs_are_clean(inner, layout):
    config = LAYOUTS[layout]
    for seed in SEEDS:
        r = drive(inner(), config, seed, ACTIONS, kv_check=True)
        assert r.stopped is None, r.stopped
        assert r.finding is None, r.finding.to_markdown()


@pytest.mark.parametrize("inner", [SpecTarget, ImplTarget])
def test_without_steering_only_the_known_triggers(inner):
    seen: Counter[str] = Counter()
    for layout, config in LAYOUTS.items():
        for seed in SEEDS:
            r = drive(inner(), config, seed, ACTIONS, kv_check=False)
            assert r.stopped is None, r.stopped
            if r.finding is not None:
                known = is_known_vllm_trigger(r.finding)
                assert known is not None, f"{layout} seed {seed}: {r.finding.to_markdown()}"
                seen[known] += 1
    assert set(seen) == {"chunk_not_block_multiple", "window_invalid_block_recovery", "window_full_remote_load"}, seen


@pytest.mark.statemachine
@pytest.mark.parametrize("family", FAMILIES)
def test_state_machine_with_steering_is_clean(family):
    """``make_machine(kv_check=True)`` steers around the triggers (its target is the plain spec: no oracle)."""
    stats = RunStats()
    cls = make_machine(family, SpecTarget, "spec", "exact", stats, kv_check=True)
    try:
        run_machine(cls, profile_settings("dev", max_examples=15, database=None), seed=2024, shrink_seconds=20)
    except Exception:
        pytest.fail(stats.finding.summary() if stats.finding else "the machine raised without a finding")
    assert stats.examples > 0 and stats.steps > 0
