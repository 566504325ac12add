"""kvspec's scheduler model (``harness/world/scheduler.py``) beside vLLM's real scheduler, one engine
step at a time, and the relation that compares their manager calls.

``ModelMirror.step(world_step, real_calls)`` replays one engine step the ``Driver`` recorded
(``harness.vllm_sched.driver.WorldStep``: arrivals, an abort, a reset, the sampled tokens and accepted
drafts, new drafts, loads that finish or fail) on the model, against its own spec, and compares the
model's manager calls with the real scheduler's (``compare_step``).  The world's actions become the
model's actions, and every choice the model leaves to the world is answered from the record
(``WorldAnswers``: the token budget is the real knob, a request's sampled token is the one the real
model runner returned, the connector answers what the stub connector answers).

The relation, per engine step (``compare_step``):
- before ``schedule()`` (abort, reset) and in ``schedule()``: the same manager calls, with the same
  arguments, in the same order;
- in ``update_from_output``: for each request the same calls in the same order, and the frees in the
  same order across requests.  The model is told which requests the real scheduler finished (stop
  token, ``max_tokens``, a failed load under the ``fail`` policy) and frees them after processing
  the step's output, where vLLM frees each inside its loop; frees are what orders the free queue.

One order is the real run's answer, not compared: that of the requests a failed KV load fails
together (``fail`` policy).  vLLM 0.33.0 (as 0.34.0) ``Scheduler.update_from_output`` finishes them
with one ``finish_requests(ids, FINISHED_ERROR)``, which walks a ``set`` of request-id strings:
their order is Python's string hashing, drawn per process (``PYTHONHASHSEED``), not a function of
the run's inputs.  The model leaves that order to the world (``fail_order``,
``StepOutputs._fail_together``) and ``WorldAnswers`` answers it with the order the real scheduler
finished them in, so the model's free queue stays the real one; which requests fail, their calls,
and where their frees fall among the step's other frees are still compared.

Used by ``kvspec fuzz --target vllm-scheduler`` in every run (``harness.vllm_sched.driver.run_one``:
a difference is an ``agreement`` finding) and by ``python -m kvspec.harness.vllm_sched.agreement`` (the figure).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.targets.spec_journal import SpecJournal
from kvspec.harness.vllm_sched.build import SchedKnobs
from kvspec.harness.world.records import SchedConfig
from kvspec.harness.world.scheduler import Scheduler
from kvspec.spec.config import KVCacheConfig

T = TypeVar("T")


@dataclass
class WorldStep:
    """What the world did in one engine step (recorded when a ``Driver`` is asked to): the inputs
    kvspec's scheduler model is given to replay the step (``harness.vllm_sched.agreement``)."""

    arrivals: list[tuple[str, tuple[int, ...], dict[str, Any] | None]] = field(default_factory=list)
    abort: str | None = None
    reset: bool = False
    sampled: dict[str, tuple[int, int]] = field(default_factory=dict)  # rid -> (accepted drafts, bonus token)
    drafts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rid -> drafts proposed after the step
    loads_done: list[str] = field(default_factory=list)  # async loads reported finished, as vLLM walks them
    load_invalid: dict[str, int] = field(default_factory=dict)  # rid -> table index of its invalid block
    sync_failed: str | None = None  # the synchronous load reported bad this step
    kept: dict[str, int] = field(default_factory=dict)  # rid -> sampled tokens its request kept (a stop drops the rest)


MANAGER_OPS = (
    O.GetComputedBlocks,
    O.AllocateSlots,
    O.Free,
    O.CacheBlocks,
    O.RemoveSkippedBlocks,
    O.EvictBlocks,
    O.ResetPrefixCache,
)
"""The manager calls compared (request operations are how each side tells the spec about its
requests, not calls the scheduler makes)."""

PHASES = ("world", "schedule", "update")
Call = tuple[str, O.Op]  # (phase, manager operation)


class WorldAnswers:
    """``harness.world.workload.Choices`` for kvspec's scheduler model, answered from one recorded
    ``WorldStep`` of the real run; a question the record cannot answer raises ``Unanswerable``."""

    def __init__(self, knobs: SchedKnobs) -> None:
        self.knobs = knobs
        self.model: Scheduler | None = None  # the model it answers (set once built)
        self.params: dict[str, dict[str, Any] | None] = {}  # request id -> its kv_transfer_params
        self.step = WorldStep()
        self.hits: dict[str, int] = {}  # request id -> tokens its last prefix lookup hit
        self._drafts: dict[str, list[int]] = {}
        self.real: list[Call] = []  # the real scheduler's manager calls of the step

    def begin(self, step: WorldStep, real: list[Call]) -> None:
        self.step, self.real = step, real
        self._drafts = {rid: list(d) for rid, d in step.drafts.items()}

    def _finished_first(self, options: Sequence[T]) -> T:
        """Of the requests failed together, the one the real scheduler finished first: its first
        call of the step's output phase comes first (one the real scheduler did not finish comes
        last, and the relation then names the difference)."""
        first: dict[str, int] = {}
        for i, (phase, op) in enumerate(self.real):
            if phase == "update":
                first.setdefault(_request_of(op), i)
        return min(options, key=lambda rid: first.get(str(rid), len(self.real)))

    def _connector(self, rid: str) -> tuple[int, bool]:
        """(tokens the stub connector offers, asynchronously?) as ``StubConnector`` answers."""
        assert self.model is not None
        params = self.params.get(rid) or {}
        r = self.model.reqs[rid]
        load, sync = int(params.get("load", 0)), bool(params.get("sync", False))
        if sync:
            load = min(load, r.num_tokens - 1)
        count = max(0, load - self.hits.get(rid, 0))
        return count, count > 0 and not sync

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        what, _, rid = label.partition(":")
        if what == "token_budget":
            value = self.knobs.token_budget
        elif what in ("ext_async", "ext_sync"):
            value = self._connector(rid)[0]
        elif what == "accepted_drafts":
            value = self.step.sampled[rid][0] if rid in self.step.sampled else -1
        elif what == "num_drafts":
            value = len(self._drafts.get(rid, ()))
        elif what == "invalid_block":
            value = hi  # the driver reports the block holding the last loaded token
        else:
            raise Unanswerable(label)
        if not lo <= value <= hi:
            raise Unanswerable(f"{label}: the real run's answer {value} is outside [{lo}, {hi}]")
        return value

    def boolean(self, label: str) -> bool:
        what, _, rid = label.partition(":")
        if what == "connector_hit":
            return self._connector(rid)[0] > 0
        if what == "async_load":
            return self._connector(rid)[1]
        if what == "sync_load_fails":
            return self.step.sync_failed == rid
        if what == "recompute_kv_load_failures":
            return self.knobs.load_failure_policy == "recompute"
        raise Unanswerable(label)

    def token(self, label: str) -> int:
        what, _, rid = label.partition(":")
        if what == "sampled" and rid in self.step.sampled:
            return self.step.sampled[rid][1]
        if what == "draft" and self._drafts.get(rid):
            return self._drafts[rid].pop(0)
        raise Unanswerable(label)

    def tokens(self, n: int, label: str) -> tuple[int, ...]:
        return tuple(self.token(label) for _ in range(n))

    def choice(self, options: Sequence[T], label: str) -> T:
        if label == "fail_order":  # the one order the relation does not compare (module docstring)
            return self._finished_first(options)
        raise Unanswerable(label)


class Unanswerable(Exception):
    """The model asked the world something the real run's record does not answer."""


def model_config(config: KVCacheConfig, knobs: SchedKnobs) -> SchedConfig:
    """kvspec's scheduler model with the real scheduler's knobs (ngram drafts: no lookahead slots)."""
    return SchedConfig(
        token_budget=knobs.token_budget,
        max_num_seqs=knobs.max_num_seqs,
        max_model_len=int(config.max_model_len),
        block_size=int(config.scheduler_block_size),
        num_spec_tokens=knobs.num_spec_tokens,
        connector=knobs.connector,
        single_group=len(config.groups) == 1,
        reserve_full_isl=True,  # vLLM 0.33's default scheduler_reserve_full_isl (the build keeps it)
        profile=config.profile,
    )


@dataclass(frozen=True)
class Difference:
    """Where one engine step's calls differ: ``kind`` for the summary, ``detail`` in full; the
    step's whole call sequences, ``(phase, operation JSON)``, set by ``ModelMirror.step``."""

    kind: str
    detail: str
    real: tuple[tuple[str, dict[str, Any]], ...] = ()
    model: tuple[tuple[str, dict[str, Any]], ...] = ()


def _by_phase(calls: list[Call]) -> dict[str, list[O.Op]]:
    out: dict[str, list[O.Op]] = {p: [] for p in PHASES}
    for phase, op in calls:
        out[phase].append(op)
    return out


def _request_of(op: O.Op) -> str:
    return str(getattr(op, "request_id", ""))


def compare_step(real: list[Call], model: list[Call]) -> Difference | None:
    """The relation of one engine step (module docstring): None, or the first difference."""
    r, m = _by_phase(real), _by_phase(model)
    for phase in ("world", "schedule"):
        if r[phase] != m[phase]:
            return _differ(phase, r[phase], m[phase])
    ru, mu = r["update"], m["update"]
    for rid in sorted({_request_of(op) for op in ru + mu}):
        rr = [op for op in ru if _request_of(op) == rid]
        mr = [op for op in mu if _request_of(op) == rid]
        if rr != mr:
            return _differ(f"update of {rid or 'the pool'}", rr, mr, "update")
    rf = [op for op in ru if isinstance(op, O.Free)]
    mf = [op for op in mu if isinstance(op, O.Free)]
    if rf != mf:
        return _differ("update (the order of frees)", rf, mf, "update: the order of frees")
    return None


def _differ(where: str, real: Sequence[O.Op], model: Sequence[O.Op], phase: str | None = None) -> Difference:
    """The difference of two call lists: the first call that differs, by name or by arguments."""
    phase = phase or where
    detail = f"{where}: real {_show(real)} / model {_show(model)}"
    for a, b in zip(real, model, strict=False):
        if a == b:
            continue
        if type(a) is not type(b):
            return Difference(f"{phase}: real {a.op} / model {b.op}", detail)
        fields = [k for k, v in op_to_json(a).items() if op_to_json(b).get(k) != v]
        return Difference(f"{phase}: {a.op} differs in {', '.join(fields)}", detail)
    longer, side = (real, "real") if len(real) > len(model) else (model, "model")
    return Difference(f"{phase}: only the {side} calls {longer[min(len(real), len(model))].op}", detail)


def _show(ops: Sequence[O.Op]) -> str:
    return "[" + ", ".join(json.dumps(op_to_json(op), separators=(",", ":")) for op in ops) + "]"


class ModelMirror:
    """kvspec's scheduler model on its own spec, fed the real run's engine steps one by one."""

    def __init__(self, config: KVCacheConfig, knobs: SchedKnobs, journal: SpecJournal | None = None) -> None:
        self.target = SpecTarget()
        self.target.reset(config)
        self.target.journal = journal  # shared with the lockstep's reference (harness.targets.spec_journal)
        self.calls: list[Call] = []
        self.phase = ["world"]
        self.answers = WorldAnswers(knobs)
        target = self.target
        self.model = Scheduler(
            model_config(config, knobs), self._emit, self.answers, lambda rid: target.observe().tables[0].get(rid, ())
        )
        self.answers.model = self.model
        self.model.transfers.load_reservation = target.load_reservation

    def _emit(self, op: O.Op) -> Any:
        out = self.target.apply(op)
        if isinstance(op, MANAGER_OPS):
            self.calls.append((self.phase[0], op))
            if isinstance(op, O.GetComputedBlocks):
                self.answers.hits[op.request_id] = out["num_hit_tokens"]
        return out

    def step(self, step: WorldStep, real: list[Call], start: Any = None) -> Difference | None:
        """Replay one engine step on the model: None when its calls relate to ``real``'s, else the
        first difference (a step the model cannot replay is one too).  ``start``: the real run's
        spec state at the step's start; the model's own, when equal, is replaced by it (the same
        value), so that its calls find the reference's in the journal."""
        self.calls.clear()
        if start is not None and self.target.state is not start and self.target.state == start:
            self.target.state = start
        try:
            _model_step(self.model, self.answers, step, real, self._emit, self.phase)
            diff = compare_step(real, self.calls)
        except (Unanswerable, AssertionError, KeyError, ValueError) as e:
            diff = Difference(f"the model could not replay the step ({type(e).__name__})", f"{type(e).__name__}: {e}")
        if diff is None:
            return None
        return replace(diff, real=_json(real), model=_json(self.calls))


def _json(calls: list[Call]) -> tuple[tuple[str, dict[str, Any]], ...]:
    return tuple((phase, op_to_json(op)) for phase, op in calls)


def _model_step(
    model: Scheduler, answers: WorldAnswers, step: WorldStep, real: list[Call], emit: Any, phase: list[str]
) -> None:
    """One recorded engine step on the model: the world's actions, ``schedule()``, the output."""
    answers.begin(step, real)
    phase[0] = "world"
    for rid, prompt, p in step.arrivals:
        answers.params[rid] = p
        model.add_request(O.AddRequest(rid, prompt))
    if step.abort is not None and step.abort in model.reqs:
        model.abort(step.abort)
    if step.reset:
        emit(O.ResetPrefixCache())
    phase[0] = "schedule"
    batch = model.schedule()
    phase[0] = "update"
    finished = {op.request_id for ph, op in real if ph == "update" and isinstance(op, O.Free)}

    def stops(rid: str, new_tokens: tuple[int, ...]) -> int | None:
        return step.kept.get(rid, len(new_tokens)) if rid in finished else None

    model.stops = stops
    for rid, pos in step.load_invalid.items():
        r = model.reqs.get(rid)
        if r is not None and r.recv == "pending":
            bs = model.cfg.block_size
            computed_blocks = -(-r.num_computed_tokens // bs)
            if pos < computed_blocks and answers.knobs.load_failure_policy == "fail":
                model.fail_load(rid, pos * bs)
            elif pos < computed_blocks:
                model.kv_arrives(rid, False, pos * bs)
    model.update_from_output(batch)
    # The requests the real scheduler finished in this step's output, in the order it freed them.
    for ph, op in real:
        if ph == "update" and isinstance(op, O.Free) and op.request_id in model.reqs:
            model.finish(op.request_id)
    for rid in step.loads_done:
        r = model.reqs.get(rid)
        if rid in model.transfers.loading_aborted or (r is not None and r.recv == "pending"):
            model.kv_arrives(rid, True)
