"""A misbehaving user target is a finding, never a crash of the harness.

- Malformed values: hostile targets wrap the spec and corrupt, one operation kind at a time, the
  outcome (a string, a float or ``True`` for an int, a missing key, the wrong number of groups, an
  out-of-range block id, a dict for a list, ...) or the observation (None, a dict, fields of the
  wrong size or element type).  Under every relation the result is a ``target-malformed`` finding
  naming the step and the operation, and nothing else is raised; through the CLI the report's trace
  replays to the same finding.
- Memory: a ``MemoryError`` from the target is a ``target-memory`` finding; so is a leak past the
  ``KVSPEC_TARGET_MEMORY_MB`` bound, with the growth in the message, and replay with the same bound
  reproduces it.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvspec.harness.check.finding import FindingError
from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.memory_guard import CHECK_EVERY
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.cli import main
from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount

RELATIONS = ("exact", "outcomes", "invariants")
CONFIG = KVCacheConfig(BlockCount(16), (full_attention(4),), TokenCount(64), enable_kv_cache_events=True)
OPS: list[O.Op] = [
    O.AddRequest("r1", tuple(range(1, 10))),  # 0
    O.GetComputedBlocks("r1"),  # 1
    O.AllocateSlots("r1", 9, use_computed_blocks=True),  # 2
    O.SetNumComputedTokens("r1", 9),  # 3
    O.Free("r1"),  # 4
    O.ResetPrefixCache(),  # 5
    O.TakeEvents(),  # 6
]
STEP = {type(op): i for i, op in enumerate(OPS)}


class Hostile:
    """The spec, except that the outcome of ``op_type`` goes through ``corrupt``, and from the
    ``observe_from``-th call on the observation goes through ``corrupt_obs``."""

    name = "hostile"
    version = "0"

    def __init__(
        self,
        op_type: type | None = None,
        corrupt: Callable[[Any], Any] = lambda x: x,
        corrupt_obs: Callable[[Observation], Any] | None = None,
        observe_from: int = 1,
    ) -> None:
        self.inner = SpecTarget()
        self.op_type, self.corrupt, self.corrupt_obs, self.observe_from = op_type, corrupt, corrupt_obs, observe_from
        self.observed = 0

    def reset(self, config: KVCacheConfig) -> None:
        self.inner.reset(config)
        self.observed = 0

    def apply(self, op: O.Op) -> Any:
        out = self.inner.apply(op)
        return self.corrupt(out) if isinstance(op, self.op_type or ()) else out

    def observe(self) -> Any:
        obs = self.inner.observe()
        self.observed += 1
        if self.corrupt_obs is not None and self.observed > self.observe_from:
            return self.corrupt_obs(obs)
        return obs


def _drop(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda out: {k: v for k, v in out.items() if k != key}


def _with(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda out: {**out, **fields}


OUTCOME_CASES: dict[str, tuple[type, Callable[[Any], Any], str]] = {
    # name: (operation kind, corruption, a piece of the expected message)
    "hit-a-string": (O.GetComputedBlocks, lambda out: "no hits", "expected a dict, got 'no hits'"),
    "hit-float-tokens": (O.GetComputedBlocks, _with(num_hit_tokens=0.0), "outcome.num_hit_tokens: expected an int"),
    "hit-bool-tokens": (O.GetComputedBlocks, _with(num_hit_tokens=False), "expected an int, got False"),
    "hit-missing-key": (O.GetComputedBlocks, _drop("num_hit_tokens"), "missing ['num_hit_tokens']"),
    "hit-extra-group": (O.GetComputedBlocks, _with(block_ids=[[], []]), "one per group (length 1, not 2)"),
    "hit-dict-groups": (O.GetComputedBlocks, _with(block_ids={"0": []}), "expected a list of block-id lists"),
    "alloc-a-string": (O.AllocateSlots, lambda out: "ok", "expected None or a dict, got 'ok'"),
    "alloc-negative-id": (O.AllocateSlots, _with(block_ids=[[-1]]), "[0][0]: expected a block id in [0, 16)"),
    "alloc-id-too-big": (O.AllocateSlots, _with(block_ids=[[16]]), "expected a block id in [0, 16), got 16"),
    "alloc-bool-id": (O.AllocateSlots, _with(block_ids=[[True]]), "expected an int, got True"),
    "alloc-tuple-ids": (O.AllocateSlots, _with(block_ids=[(1, 2, 3)]), "expected a list of block ids, got (1, 2, 3)"),
    "alloc-no-groups": (O.AllocateSlots, _with(block_ids=[]), "(length 1, not 0)"),
    "alloc-missing-key": (O.AllocateSlots, lambda out: {}, "missing ['block_ids']"),
    "reset-an-int": (O.ResetPrefixCache, lambda out: int(out), "expected a bool, got 1"),
    "events-a-dict": (O.TakeEvents, lambda out: {"events": out}, "expected a list of events"),
    "events-bad-type": (O.TakeEvents, lambda out: [{"type": "Stored"}], "expected one of ['AllBlocksCleared'"),
    "events-bad-hash": (O.TakeEvents, lambda out: [{**out[0], "block_hashes": ["zz"]}], "expected a hex string"),
    "free-not-none": (O.Free, lambda out: True, "expected None (the operation has no outcome), got True"),
    "add-not-none": (O.AddRequest, lambda out: 0, "expected None (the operation has no outcome), got 0"),
}


def _obs_with(**fields: Any) -> Callable[[Observation], Observation]:
    return lambda obs: dataclasses.replace(obs, **fields)


OBSERVATION_CASES: dict[str, tuple[Callable[[Observation], Any], str]] = {
    "none": (lambda obs: None, "observe(): expected an Observation, got None"),
    "a-dict": (lambda obs: {"tables": obs.tables}, "observe(): expected an Observation, got {'tables'"),
    "short-ref-cnt": (lambda obs: dataclasses.replace(obs, ref_cnt=obs.ref_cnt[:-1]), "(length 16, not 15)"),
    "list-ref-cnt": (lambda obs: dataclasses.replace(obs, ref_cnt=list(obs.ref_cnt)), "ref_cnt: expected a tuple"),
    "str-in-table": (_obs_with(tables=({"r1": (1, "2")},)), "tables[0]['r1'][1]: expected an int, got '2'"),
    "two-tables": (_obs_with(tables=({}, {})), "tables: expected a tuple of dicts, one per group (length 1, not 2)"),
    "long-block-key": (lambda obs: dataclasses.replace(obs, block_key=(*obs.block_key, None)), "(length 16, not 17)"),
    "str-hash": (_obs_with(request_block_hashes={"r1": ("00",)}), "request_block_hashes['r1'][0]: expected a bytes"),
    "free-id-range": (_obs_with(free_queue=(1, 99)), "free_queue[1]: expected a block id in [0, 16), got 99"),
    "set-secondary": (_obs_with(secondary_keys={1: {b"k"}}), "secondary_keys[1]: expected a frozenset"),
    # equal in value to a well-formed observation: only the exact types tell them apart
    "bool-ref-cnt": (
        lambda obs: dataclasses.replace(obs, ref_cnt=(False, *obs.ref_cnt[1:])),
        "ref_cnt[0]: expected an int",
    ),
    "float-cached-count": (_obs_with(num_cached_block=({"r1": 0.0},)), "num_cached_block[0]['r1']: expected an int"),
}


def _run(target: Any, relation: str, ops: list[O.Op] = OPS, **kw: Any) -> Lockstep:
    ls = Lockstep(CONFIG, target, CheckSettings(relation=relation, step_timeout=None, **kw))
    ls.start()
    for op in ops:
        ls.apply(op)
    return ls


@pytest.mark.parametrize("relation", RELATIONS)
def test_the_spec_passes_its_own_forms(relation: str) -> None:
    """The control: the unmodified spec (and a hostile target that corrupts nothing) run clean."""
    _run(SpecTarget(), relation)
    _run(Hostile(), relation)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("case", sorted(OUTCOME_CASES))
def test_a_malformed_outcome_is_a_finding(case: str, relation: str) -> None:
    op_type, corrupt, needle = OUTCOME_CASES[case]
    with pytest.raises(FindingError) as e:
        _run(Hostile(op_type, corrupt), relation)
    f = e.value.finding
    step = STEP[op_type]
    assert (f.kind, f.step, (f.op or {}).get("op")) == ("target-malformed", step, OPS[step].op), f.summary()
    assert needle in f.message, f.message
    assert f"the outcome of {OPS[step].op}" in f.message
    json.dumps(f.to_json())  # the report can be written whatever came back


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("case", sorted(OBSERVATION_CASES))
def test_a_malformed_observation_is_a_finding(case: str, relation: str) -> None:
    corrupt, needle = OBSERVATION_CASES[case]
    with pytest.raises(FindingError) as e:
        _run(Hostile(corrupt_obs=corrupt), relation)
    f = e.value.finding
    assert (f.kind, f.step, (f.op or {}).get("op")) == ("target-malformed", 0, "add_request"), f.summary()
    assert needle in f.message, f.message
    json.dumps(f.to_json())


def test_a_malformed_first_observation_is_a_setup_finding() -> None:
    with pytest.raises(FindingError) as e:
        _run(Hostile(corrupt_obs=lambda obs: "state", observe_from=0), "exact")
    assert (e.value.finding.kind, e.value.finding.step) == ("target-malformed", None)
    assert "setup" in e.value.finding.summary()


HOSTILE_MODULE = """
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.core import ops as O


class NoHitCount(SpecTarget):
    def apply(self, op):
        out = super().apply(op)
        if isinstance(op, O.GetComputedBlocks):
            return {"block_ids": out["block_ids"]}  # num_hit_tokens missing
        return out


class Leaky(SpecTarget):
    def apply(self, op):
        self.__dict__.setdefault("hoard", []).append(b"x" * 2**20)  # 1 MiB per step, pages touched
        return super().apply(op)
"""


@pytest.fixture
def hostile_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    name = f"kvspec_hostile_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOSTILE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / name


def _fuzz_and_replay(module: Path, factory: str, relation: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """``kvspec fuzz`` (exit 1, a report) and ``kvspec replay`` of its trace (exit 1): both summaries."""
    out = module.parent / "out"
    target = f"{module.name}:{factory}"
    argv = ["fuzz", "--target", target, "--family", "full", "--relation", relation, "--seconds", "20"]
    argv += ["--out", str(out), "--shrink-seconds", "3", "--reduce-seconds", "3", "--db", str(module.parent / "db")]
    assert main(argv) == 1
    printed = capsys.readouterr()
    fuzz_err = printed.out + printed.err
    (trace,) = out.glob("*/trace.json")
    assert main(["replay", str(trace.parent), "--target", target]) == 1
    return fuzz_err, capsys.readouterr().out


@pytest.mark.parametrize("relation", RELATIONS)
def test_a_malformed_target_through_the_cli(
    hostile_module: Path, relation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fuzz_err, replay_out = _fuzz_and_replay(hostile_module, "NoHitCount", relation, capsys)
    assert "FOUND target-malformed at step" in fuzz_err and "(get_computed_blocks)" in fuzz_err, fuzz_err
    assert "FAIL" in replay_out and "target-malformed at step" in replay_out, replay_out
    assert "missing ['num_hit_tokens']" in replay_out


# --- memory -----------------------------------------------------------------------------------------


class RaisesMemoryError(SpecTarget):
    """Runs out of memory on its first allocation (or in ``where``)."""

    def __init__(self, where: str = "apply") -> None:
        super().__init__()
        self.where = where

    def reset(self, config: KVCacheConfig) -> None:
        super().reset(config)
        if self.where == "reset":
            raise MemoryError()

    def apply(self, op: O.Op) -> Any:
        if self.where == "apply" and isinstance(op, O.AllocateSlots):
            raise MemoryError("out of host memory")
        return super().apply(op)

    def observe(self) -> Observation:
        if self.where == "observe" and self.requests:
            raise MemoryError()
        return super().observe()


@pytest.mark.parametrize("where, step", [("reset", None), ("apply", 2), ("observe", 0)])
def test_a_memory_error_is_a_finding(where: str, step: int | None) -> None:
    with pytest.raises(FindingError) as e:
        _run(RaisesMemoryError(where), "exact")
    f = e.value.finding
    assert (f.kind, f.step) == ("target-memory", step), f.summary()
    assert "MemoryError" in f.message and "may depend on the process' state" in f.message


class Leaky(SpecTarget):
    """Keeps 1 MiB (pages touched) for every operation."""

    def apply(self, op: O.Op) -> Any:
        self.__dict__.setdefault("hoard", []).append(b"x" * 2**20)
        return super().apply(op)


LONG_OPS: list[O.Op] = [op for k in range(3 * CHECK_EVERY) for op in (O.AddRequest(f"r{k}", (1, 2)), O.Free(f"r{k}"))]


def test_a_leak_past_the_bound_is_a_finding() -> None:
    with pytest.raises(FindingError) as e:
        _run(Leaky(), "exact", LONG_OPS, memory_mb=8)
    f = e.value.finding
    assert f.kind == "target-memory" and f.step == CHECK_EVERY, f.summary()
    grown = float(f.message.split("grew by ")[1].split(" MiB")[0])
    assert grown >= CHECK_EVERY - 2, f.message  # 1 MiB per step
    assert "KVSPEC_TARGET_MEMORY_MB" in f.message


def test_the_bound_is_passed_in_and_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is a field of the checks the lockstep is given; the variable is read at the edges only
    (``harness.run.options.from_environ``), so setting it does nothing to a lockstep built without it."""
    from kvspec.harness.run.options import from_environ

    monkeypatch.setenv("KVSPEC_TARGET_MEMORY_MB", "8")
    _run(Leaky(), "exact", LONG_OPS)  # no bound passed: no finding
    _run(SpecTarget(), "exact", LONG_OPS, memory_mb=8)  # a clean target stays within a small bound
    with pytest.raises(FindingError, match="target-memory"):
        _run(Leaky(), "exact", LONG_OPS, memory_mb=from_environ({"KVSPEC_TARGET_MEMORY_MB": "8"})["memory_mb"])


def test_a_leak_reproduces_on_replay_with_the_same_bound(
    hostile_module: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVSPEC_TARGET_MEMORY_MB", "8")
    fuzz_err, replay_out = _fuzz_and_replay(hostile_module, "Leaky", "exact", capsys)
    assert "FOUND target-memory at step" in fuzz_err and "grew by" in fuzz_err, fuzz_err
    assert "target-memory at step" in replay_out and "grew by" in replay_out, replay_out
    monkeypatch.delenv("KVSPEC_TARGET_MEMORY_MB")
    (trace,) = (hostile_module.parent / "out").glob("*/trace.json")
    target = f"{hostile_module.name}:Leaky"
    assert main(["replay", str(trace.parent), "--target", target]) == 0  # without the bound: as recorded
