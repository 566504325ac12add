"""The unmutated managers pass the ledger: on seeded workload runs over every layout each finding is
one of the three vLLM 0.33 candidate bugs of docs/findings.md (harness.ledger.known_bugs), which the spec
models and ``impl`` refuses the inputs of (impl/allocator/refusals.py); the Hypothesis state machine
(ledger on by default, known bugs counted) agrees."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from ledger_cases import drive, is_known_vllm_trigger

from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.world.families import FAMILIES
from kvspec.spec.config import KVCacheConfig, chunked_local, cross_attention, full_attention, sliding_window

FULL = KVCacheConfig(24, (full_attention(4),), 120)
SWA = KVCacheConfig(24, (sliding_window(4, 7),), 120)
LAYOUTS = {
    "full": FULL,
    "full-bs1": KVCacheConfig(40, (full_attention(1),), 60),
    "sliding_window": SWA,
    "sliding_window-small": KVCacheConfig(30, (sliding_window(2, 3),), 80),
    "chunked_local": KVCacheConfig(24, (chunked_local(4, 8),), 120),
    "chunked_local-odd": KVCacheConfig(30, (chunked_local(2, 5),), 80),  # candidate bug 1 (K3)
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


TRIGGERS = {"K3": "chunk_not_block_multiple", "K2": "window_invalid_block_recovery", "K1": "window_full_remote_load"}
REFUSED = "unsupported: impl refuses "  # how a run of impl stops at the input of a known bug


@pytest.mark.parametrize("inner", [SpecTarget, ImplTarget])
def test_seeded_runs_end_clean_or_at_a_known_trigger(inner):
    """Nothing steers the workload around the three triggers: each shows up, nothing else does, and
    most runs go to the end (a run stops at its first finding: the record no longer holds after it).
    The spec reads the null block there, as vLLM 0.33 does; impl refuses the input instead, so its runs
    stop at the refusal and never at a finding."""
    seen: Counter[str] = Counter()
    runs = 0
    for layout, config in LAYOUTS.items():
        for seed in SEEDS:
            runs += 1
            r = drive(inner(), config, seed, ACTIONS)
            if r.stopped is not None and inner is ImplTarget:
                assert r.stopped.startswith(REFUSED), r.stopped
                seen[TRIGGERS[r.stopped[len(REFUSED) :][:2]]] += 1
                continue
            assert r.stopped is None, r.stopped
            if r.finding is not None:
                known = is_known_vllm_trigger(r.finding)
                assert known is not None and inner is SpecTarget, f"{layout} seed {seed}: {r.finding.to_markdown()}"
                seen[known] += 1
    assert set(seen) == set(TRIGGERS.values()), seen
    assert sum(seen.values()) <= runs // 3, (seen, runs)


@pytest.mark.statemachine
@pytest.mark.parametrize("family", FAMILIES)
def test_state_machine_reports_only_known_bugs(family, machine_run):
    """The fuzzing machine on the spec (ledger on, known bugs counted, not failing) ends clean."""
    stats = machine_run(family, SpecTarget, "spec")
    assert stats.examples > 0 and stats.steps > 0
