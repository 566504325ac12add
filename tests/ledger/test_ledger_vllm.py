"""The ledger on the real vLLM 0.33 ``KVCacheManager``: the three candidate bugs of docs/findings.md
are ledger findings with the oracle off, the workload finds each (nothing steers around them), and
otherwise vLLM runs clean (skipped when vLLM is not installed)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from ledger_cases import (
    CANDIDATES,
    CHUNKED,
    FULL_LOAD,
    FULL_LOAD_OPS,
    drive,
    full_remote_load_ops,
    is_known_vllm_trigger,
    replay_ops,
)

from kvspec.harness.check.lockstep import FindingError, Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.world.families import FAMILIES
from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window

pytestmark = pytest.mark.vllm

# Where the workload reaches each candidate (seeds scanned in order; see bench_ledger.py).
SEARCH = {
    "chunk_not_block_multiple": KVCacheConfig(30, (chunked_local(2, 5),), 80),
    "window_invalid_block_recovery": KVCacheConfig(30, (sliding_window(2, 3),), 80),
    "window_full_remote_load": KVCacheConfig(30, (chunked_local(1, 2),), 40),
}
CLEAN = {
    "full": KVCacheConfig(24, (full_attention(4),), 120),
    "sliding_window": KVCacheConfig(24, (sliding_window(4, 7),), 120),
    "chunked_local": KVCacheConfig(24, (chunked_local(4, 8),), 120),
    "hybrid": KVCacheConfig(48, (full_attention(4), sliding_window(4, 5), chunked_local(4, 8)), 120),
    "hybrid_diff": KVCacheConfig(60, (full_attention(4), sliding_window(2, 5)), 80),
    "async": replace(KVCacheConfig(24, (sliding_window(4, 7),), 120), max_in_flight_tokens=6),
}


@pytest.fixture(scope="module")
def vllm_factory():
    from kvspec.harness.targets import TargetLoadError

    try:
        return resolve("vllm").factory
    except TargetLoadError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_candidate_bug_reproduced_on_vllm(vllm_factory, candidate):
    config, ops = CANDIDATES[candidate]
    i, f = replay_ops(vllm_factory(), config, ops)
    assert f is not None and i == len(ops) - 1 and f.block == 0, f
    assert is_known_vllm_trigger(f) == candidate, f.to_markdown()
    # The same through the lockstep driver, vLLM against the spec (which agrees on every table).
    ls = Lockstep(config, vllm_factory(), CheckSettings(strict_known=True))
    ls.start()
    with pytest.raises(FindingError) as e:
        for op in ops:
            ls.apply(op)
    assert e.value.finding.kind == "kv-ledger" and e.value.finding.step == len(ops) - 1


@pytest.mark.parametrize("candidate", sorted(SEARCH))
def test_the_workload_finds_each_candidate_on_vllm(vllm_factory, candidate):
    config = SEARCH[candidate]
    found = []
    for seed in range(6):
        r = drive(vllm_factory(), config, seed, 300)
        assert r.stopped is None, r.stopped
        if r.finding is not None:
            found.append(is_known_vllm_trigger(r.finding))
            if found[-1] == candidate:
                return
    pytest.fail(f"{candidate} not found in 6 seeded runs (found {found})")


def test_vllm_runs_end_clean_or_at_a_known_trigger(vllm_factory):
    seen: Counter[str] = Counter()
    runs = 0
    for name, config in CLEAN.items():
        for seed in range(3):
            runs += 1
            r = drive(vllm_factory(), config, seed, 250)
            assert r.stopped is None, r.stopped
            if r.finding is not None:
                known = is_known_vllm_trigger(r.finding)
                assert known is not None, f"{name} seed {seed}: {r.finding.to_markdown()}"
                seen[known] += 1
    print(f"known triggers: {dict(seen)} in {runs} runs")
    assert sum(seen.values()) <= runs // 2, (seen, runs)


@pytest.mark.statemachine
@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "v0_20"])
def test_vllm_state_machine_reports_only_known_bugs(vllm_factory, family, machine_run):
    """vLLM against the spec with the ledger on (its default), known bugs counted and not failing."""
    machine_run(family, vllm_factory, "vllm", examples=8, seed=7, shrink_seconds=30)


# --- the proposed fixes (harness/mutants/fixes_vllm.py, ``--target vllm-fixed``) ------------------------------

SWA_LOAD = KVCacheConfig(20, (sliding_window(4, 7),), 40)
SWA_LOAD_OPS = full_remote_load_ops(tuple(range(1, 15)), hit=0)  # P=14: (P - W + 1) % B == 0, K1's condition


def _run(target, config, ops, relation):
    ls = Lockstep(config, target, CheckSettings(relation=relation, strict_known=True))
    ls.start()
    for op in ops:
        ls.apply(op)
    return ls


@pytest.mark.parametrize(
    "config, ops", [(FULL_LOAD, FULL_LOAD_OPS), (SWA_LOAD, SWA_LOAD_OPS)], ids=["chunked", "window"]
)
def test_k1_fix_removes_the_null_read_and_still_releases_the_window(vllm_factory, config, ops):
    from kvspec.harness.mutants.fixes_vllm import FixedVllmTarget

    with pytest.raises(FindingError) as e:  # control: vLLM 0.33 as released
        _run(vllm_factory(), config, ops, "invariants")
    assert e.value.finding.kind == "kv-ledger"
    ls = _run(FixedVllmTarget(), config, ops, "invariants")
    if config is SWA_LOAD:  # token 13 reads [7, 13]: block 0 (positions 0-3) may go, and does
        assert ls.tgt_obs.tables[0]["r"][0] == 0


def test_k3_fix_refuses_the_config(vllm_factory):
    from kvspec.harness.mutants.fixes_vllm import FixedVllmTarget
    from kvspec.harness.targets.base import Unsupported

    with pytest.raises(Unsupported, match="not a multiple"):
        FixedVllmTarget().reset(CHUNKED)
    FixedVllmTarget().reset(KVCacheConfig(20, (chunked_local(2, 6),), 40))  # a block multiple is fine
