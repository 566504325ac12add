"""Each impl allocator mutant the torch oracle catches is caught by the KV ledger alone (oracle off).

Same workload and configs as ``tests/oracle/test_oracle_mutants.py`` (``run_seeded``): seeds are
scanned in order until the ledger raises other than on a known vLLM 0.33 trigger (which the spec
and ``impl`` model too); the finding must be the named invariant the bug breaks, and the correct
allocator must pass the very same run (or stop at a known trigger only later).
``bench_ledger.py`` prints operations and time to detection next to the oracle's.
"""

from __future__ import annotations

import pytest
from ledger_cases import DriveResult, drive, is_known_vllm_trigger

from kvspec.harness.mutants.impl import MUTANTS, make_mutant_target
from kvspec.harness.targets.impl import ImplTarget
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window

ACTIONS = 300
MAX_SEEDS = 4
FULL = KVCacheConfig(24, (full_attention(4),), 120)
SWA = KVCacheConfig(24, (sliding_window(4, 7),), 120)

# mutant -> config; caught at seed 1, 0, 0, 0 (bench_ledger.py) by the record's ``intended`` invariant:
# a referenced block handed out fresh (kv_read_written), published before the load / chunk wrote it
# (kv_publish_written), the oldest in-window block dropped (kv_read_in_real_block), a hit on another
# adapter's KV (kv_read_own_kv).
CASES = {
    "reuse_while_referenced": FULL,
    "hash_before_write": FULL,
    "window_off_by_one": SWA,
    "hash_ignores_lora": FULL,
}


def first_detection(mutant: str, config: KVCacheConfig) -> tuple[int, DriveResult]:
    for seed in range(MAX_SEEDS):
        r = drive(make_mutant_target(mutant), config, seed, ACTIONS)
        assert r.stopped is None, f"{mutant} seed {seed}: the mutant broke before the ledger saw it: {r.stopped}"
        if r.finding is not None and is_known_vllm_trigger(r.finding) is None:
            return seed, r
    pytest.fail(f"{mutant}: not caught by the ledger within {MAX_SEEDS} runs of {ACTIONS} workload actions")


@pytest.mark.mutant
@pytest.mark.parametrize("mutant", sorted(CASES))
def test_mutant_caught_by_the_ledger_alone(mutant):
    config, invariant = CASES[mutant], MUTANTS[mutant].intended
    seed, r = first_detection(mutant, config)
    f = r.finding
    assert f is not None
    print(f"{mutant}: caught in run {seed + 1} after {r.ops} operations: {f.summary}")
    assert f.invariant == invariant, f.to_markdown()
    if mutant == "window_off_by_one":
        assert f.block == 0 and f.group_kind == "sliding_window", f.to_markdown()
    if mutant == "hash_ignores_lora":
        assert f.source == "prefix-hit" and f.held != "unwritten", f.to_markdown()
    control = drive(ImplTarget(), config, seed, ACTIONS)
    assert control.stopped is None, control
    assert control.finding is None or is_known_vllm_trigger(control.finding), control.finding.to_markdown()
    assert control.ops > r.ops


def test_every_impl_mutant_has_a_case():
    assert set(CASES) == set(MUTANTS)
