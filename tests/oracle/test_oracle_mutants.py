"""Each deliberate allocator bug is caught by the KV-content oracle alone (no spec comparison).

For every mutant the seeded workload runs (``harness.world.workload.run_seeded``) are
scanned in seed order until the oracle raises; the test asserts it does within a bounded number of
runs, that the finding is of the kind the bug must produce, and that the correct allocator passes
the very same run (so the bug, not the workload, caused it).  ``bench_oracle.py`` prints the runs /
operations to detection over more seeds.
"""

from __future__ import annotations

import pytest
from configs_oracle import FAMILIES
from oracle_drive import TraceResult, drive

from kvspec.harness.mutants.impl import MUTANTS, make_mutant_target
from kvspec.harness.oracle.target import KVCheckTarget
from kvspec.harness.targets.impl import ImplTarget
from kvspec.spec.config import KVCacheConfig

ACTIONS = 300
MAX_SEEDS = 8

# mutant -> (config, expected finding kind); with ACTIONS = 300, the first run that catches each
# is seed 1 (522 ops), seed 0 (224 ops), seed 0 (33 ops) and seed 0 (68 ops) respectively.
CASES = {
    "reuse_while_referenced": (FAMILIES["full"][0], "attention-output"),
    "hash_before_write": (FAMILIES["full"][0], "prefix-hit"),
    "window_off_by_one": (FAMILIES["sliding_window"][0], "attention-output"),
    "hash_ignores_lora": (FAMILIES["full"][0], "prefix-hit"),
}


def first_detection(mutant: str, config: KVCacheConfig) -> tuple[int, TraceResult]:
    for seed in range(MAX_SEEDS):
        r = drive(KVCheckTarget(make_mutant_target(mutant), device="cpu"), config, seed, ACTIONS)
        assert r.stopped is None, f"{mutant} seed {seed}: the mutant broke before the oracle saw it: {r.stopped}"
        if r.finding is not None:
            return seed, r
    pytest.fail(f"{mutant}: not caught by the KV oracle within {MAX_SEEDS} runs of {ACTIONS} workload actions")


@pytest.mark.mutant
@pytest.mark.parametrize("mutant", sorted(CASES))
def test_mutant_caught_by_kv_oracle_alone(mutant):
    config, kind = CASES[mutant]
    seed, r = first_detection(mutant, config)
    f = r.finding
    assert f is not None
    print(f"{mutant}: caught in run {seed + 1} (seed {seed}) after {r.ops} operations: {f.summary}")
    assert f.kind == kind, f.to_markdown()
    if mutant == "window_off_by_one":
        assert any(b.block_id == 0 and b.nan for b in f.bad_kv), f.to_markdown()  # read through the null block
    if mutant == "hash_before_write":
        assert all(b.nan for b in f.bad_kv), f.to_markdown()  # the hit blocks were never written
    if mutant == "hash_ignores_lora":
        assert not any(b.nan for b in f.bad_kv), f.to_markdown()  # another adapter's (real) KV
    if mutant == "reuse_while_referenced":
        assert f.bad_kv and 0 not in f.block_ids, f.to_markdown()  # a real block lost its contents
    # Control: the correct allocator runs the same workload (same seed, same actions) cleanly.
    control = drive(KVCheckTarget(ImplTarget(), device="cpu"), config, seed, ACTIONS)
    assert control.finding is None and control.stopped is None, control
    assert control.ops > r.ops  # and gets past the point where the mutant was caught


def test_mutant_registry():
    assert {"reuse_while_referenced", "hash_before_write", "window_off_by_one"} <= set(MUTANTS)
    with pytest.raises(ValueError):
        make_mutant_target("no_such_bug")
