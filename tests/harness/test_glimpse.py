"""Incremental checking (``harness.core.glimpse``): glimpses agree across targets, a glimpsed step still
catches what it touches, the periodic and end-of-run full checks catch what it does not, and the
deliberate bugs of the catalogue are still reported with glimpses on."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvspec.harness.bench.lockstep import pool_runs
from kvspec.harness.check.finding import FindingError
from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.glimpse import ENV, full_check_every, parse_full_check_every
from kvspec.harness.mutants.spec import MUTANTS, make_mutant
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec import block_pool
from kvspec.spec.config import KVCacheConfig


@pytest.fixture(scope="module")
def runs() -> dict[int, tuple[KVCacheConfig, list[O.Op]]]:
    return pool_runs(actions=150)


def _replay(config: KVCacheConfig, ops: list[O.Op], target: Any, every: int | None) -> Lockstep:
    ls = Lockstep(config, target, CheckSettings(step_timeout=None, full_check_every=every))
    ls.start()
    for op in ops:
        ls.apply(op)
    ls.finish()
    return ls


def _targets() -> list[Any]:
    out: list[Any] = [SpecTarget, ImplTarget]
    try:
        from kvspec.harness.targets.vllm import VllmTarget, vllm_version

        if vllm_version() is not None:
            out.append(VllmTarget)
    except Exception:  # vLLM not installed: spec and impl only
        pass
    return out


@pytest.mark.parametrize(
    "every", [pytest.param(2, marks=pytest.mark.full), pytest.param(5, marks=pytest.mark.full), None]
)  # 2: 20 s, 5: 10 s, the full tier
def test_correct_targets_agree_with_glimpses(runs, every):
    """No false positive: spec, impl and (when installed) vLLM replay the pool benchmark's
    workloads with glimpses between full checks, at every pool size."""
    for config, ops in runs.values():
        for make in _targets():
            ls = _replay(config, ops, make(), every)
            assert ls.incremental == (full_check_every(int(config.num_blocks), every) > 1)


def test_auto_cadence():
    assert full_check_every(16) == 1
    assert full_check_every(256) == 1
    assert full_check_every(1024) == 16
    assert full_check_every(65536) == 1024
    assert full_check_every(65536, 1) == 1


@pytest.mark.parametrize("text", ["0", "-3", "x", "1.5", "nan", str(1 << 31)])
def test_bad_cadence_is_refused_with_the_variable_named(text):
    with pytest.raises(ValueError, match=ENV):
        parse_full_check_every(text)


def test_cadence_parses():
    assert parse_full_check_every("auto") is None
    assert parse_full_check_every(" 7 ") == 7


class _Bug(SpecTarget):
    """The spec with one deliberate corruption after the ``at``-th operation: ``block``'s ref count
    raised by one, a change no operation of that step makes."""

    def __init__(self, at: int, block: int) -> None:
        super().__init__()
        self.at, self.block, self.n = at, block, 0

    def apply(self, op: O.Op) -> Any:
        out = super().apply(op)
        self.n += 1
        if self.n == self.at:
            pool = self.state.pool
            ref = list(pool.ref_cnt)
            ref[self.block] += 1
            self.state = dataclasses.replace(self.state, pool=dataclasses.replace(pool, ref_cnt=tuple(ref)))
        return out


def _first_allocation(config: KVCacheConfig, ops: list[O.Op]) -> tuple[int, int]:
    """The index (1-based count of operations) of the first allocation, and a block it took."""
    spec = SpecTarget()
    spec.reset(config)
    for i, op in enumerate(ops, 1):
        out = spec.apply(op)
        if isinstance(op, O.AllocateSlots) and out and out["block_ids"][0]:
            return i, out["block_ids"][0][-1]
    raise AssertionError("the workload allocates nothing")


def test_glimpse_catches_a_change_to_a_touched_block_at_its_step(runs):
    config, ops = runs[1024]
    at, block = _first_allocation(config, ops)
    with pytest.raises(FindingError) as e:
        _replay(config, ops, _Bug(at, block), every=50)
    assert e.value.finding.kind == "divergence"
    assert e.value.finding.step == at - 1  # the operation that made the change, not a later full check
    assert "spec_glimpse" in e.value.finding.witness


def test_a_change_outside_the_glimpse_is_caught_by_the_next_full_check(runs):
    config, ops = runs[1024]
    untouched = int(config.num_blocks) // 2  # mid-queue: in no table and at neither end of the queue
    at = 3
    with pytest.raises(FindingError) as e:
        _replay(config, ops, _Bug(at, untouched), every=10)
    f = e.value.finding
    assert f.kind == "divergence" and untouched in f.blocks
    assert f.step is not None and at - 1 < f.step  # not at its own step
    assert sum(O.changes_observation(op) for op in ops[at : f.step + 1]) <= 10  # within one cadence
    assert "spec_glimpse" not in f.witness  # a full check found it


def test_the_end_of_run_check_catches_a_late_change(runs):
    config, ops = runs[1024]
    untouched = int(config.num_blocks) // 2
    with pytest.raises(FindingError) as e:
        _replay(config, ops, _Bug(len(ops) - 1, untouched), every=10_000)
    assert e.value.finding.step == len(ops) - 1


class _HashBug(SpecTarget):
    """The spec whose ``at``-th operation, an ``AddRequest``, loses the request's last block hash."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.n = at, 0

    def apply(self, op: O.Op) -> Any:
        out = super().apply(op)
        self.n += 1
        if self.n == self.at:
            assert isinstance(op, O.AddRequest)
            r = self.book.native[op.request_id]
            self.book.native[op.request_id] = dataclasses.replace(r, block_hashes=r.block_hashes[:-1])
        return out


def _first_hashed_arrival(config: KVCacheConfig, ops: list[O.Op]) -> int:
    """The index (1-based) of the first ``AddRequest`` whose prompt fills a hash block."""
    for i, op in enumerate(ops, 1):
        if isinstance(op, O.AddRequest) and len(op.prompt_token_ids) >= int(config.hash_block_size):
            return i
    raise AssertionError("no arrival fills a hash block")


def test_a_request_operation_glimpse_catches_wrong_hashes_at_its_step(runs):
    """A request operation is glimpsed through its block hashes alone (``harness.check.glimpsing``):
    a wrong hash is still found at the operation itself."""
    config, ops = runs[1024]
    at = _first_hashed_arrival(config, ops)
    with pytest.raises(FindingError) as e:
        _replay(config, ops, _HashBug(at), every=50)
    f = e.value.finding
    assert f.kind == "divergence" and f.step == at - 1 and "block hashes" in f.message
    assert "spec_glimpse" in f.witness


def test_a_pool_change_during_a_request_operation_is_caught_within_a_cadence(runs):
    """What a request operation's glimpse no longer reads (the front of the free queue, here) is
    found by the next glimpse that reads it or the next full check."""
    config, ops = runs[1024]
    at = _first_hashed_arrival(config, ops)
    spec = SpecTarget()
    spec.reset(config)
    for op in ops[:at]:
        spec.apply(op)
    front = spec.state.pool.free_queue[0]
    with pytest.raises(FindingError) as e:
        _replay(config, ops, _Bug(at, front), every=10)
    f = e.value.finding
    assert f.kind == "divergence" and front in f.blocks
    assert f.step is not None and at - 1 < f.step
    assert sum(O.changes_observation(op) for op in ops[at : f.step + 1]) <= 10  # within one cadence


# The slowest to catch run in the full tier; tests/mutants runs them without glimpses in every tier.
FULL_TIER_ONLY = {"cache_drafts", "hits_not_touched", "swa_skip_n_minus_w", "free_order_appended"}


@pytest.mark.mutant
@pytest.mark.parametrize(
    "name", [n if n not in FULL_TIER_ONLY else pytest.param(n, marks=pytest.mark.full) for n in sorted(MUTANTS)]
)
def test_mutants_are_still_reported_with_glimpses(name, monkeypatch, machine_run):
    """The same runs as tests/mutants, with glimpses between full checks every 4 operations and the
    persistent pool containers of large pools (``spec.persistent``) in these small ones: every
    deliberate bug is still reported (no check weakened)."""
    monkeypatch.setattr(block_pool, "SMALL_POOL", 0)
    glimpsed = CheckSettings(full_check_every=4)
    family, target = MUTANTS[name].family, f"mutant:{name}"
    kw = {"examples": None, "seed": 11, "shrink_seconds": 5, "profile": "ci", "checks": glimpsed, "expect": "finding"}
    stats = machine_run(family, lambda: make_mutant(name), target, **kw)
    assert stats.finding is not None, f"mutant {name} was not reported with glimpses on"
