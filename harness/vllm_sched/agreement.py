"""Does kvspec's scheduler model (``harness/world/scheduler.py``) make the manager calls vLLM's real
scheduler makes?  Same inputs, both schedulers, the two call sequences compared.

One run: the real 0.33.0 ``Scheduler`` is driven as ``kvspec fuzz --target vllm-scheduler`` drives it
(``harness.vllm_sched.driver``), and the ``Driver`` records what the world did in each engine step
(``WorldStep``: arrivals, an abort, a reset, the sampled tokens and accepted drafts, new drafts,
loads that finish or fail).  Then kvspec's model replays those steps against the spec: the world's
actions become the model's actions, and every choice the model leaves to the world is answered from
the record (``WorldAnswers``: the token budget is the real knob, a request's sampled token is the
one the real model runner returned, the connector answers what the stub connector answers).

The relation, per engine step (``compare_step``):
- before ``schedule()`` (abort, reset) and in ``schedule()``: the same manager calls, with the same
  arguments, in the same order;
- in ``update_from_output``: for each request the same calls in the same order, and the frees in the
  same order across requests.  The model is told which requests the real scheduler finished (stop
  token, ``max_tokens``, a failed load under the ``fail`` policy) and frees them after processing
  the step's output, where vLLM frees each inside its loop; frees are what orders the free queue.

A run agrees up to its first differing step; the rest of it is not compared (the two schedulers'
states differ from there).  ``python -m harness.vllm_sched.agreement --seconds 600`` prints the
figure (steps and calls that agree, runs that agree whole) and each kind of first difference.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harness.core import ops as O
from harness.core.ops_json import op_to_json
from harness.targets.spec import SpecTarget
from harness.vllm_sched.build import SchedKnobs, build_scheduler
from harness.vllm_sched.driver import SCHED_FAMILIES, Driver, WorldStep, draw_config, draw_knobs
from harness.vllm_sched.proxy import install
from harness.world.records import SchedConfig
from harness.world.scheduler import Scheduler
from harness.world.workload import SeededChoices
from spec.config import KVCacheConfig

T = TypeVar("T")

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


class CallLog:
    """A proxy sink (``harness.vllm_sched.proxy``) that keeps the real scheduler's manager calls,
    each with the phase of the engine step it came in."""

    def __init__(self) -> None:
        self.phase = "world"
        self.calls: list[Call] = []

    @property
    def done(self) -> bool:
        return False

    def request_op(self, op: O.Op, request: Any) -> None:
        pass

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        self.calls.append((self.phase, op))


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

    def begin(self, step: WorldStep) -> None:
        self.step = step
        self._drafts = {rid: list(d) for rid, d in step.drafts.items()}

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
        raise Unanswerable(label)


class Unanswerable(Exception):
    """The model asked the world something the real run's record does not answer."""


@dataclass
class RunAgreement:
    """One run compared: steps and calls up to the first difference, and that difference."""

    family: str
    seed: int
    engine_steps: int = 0
    steps_agreed: int = 0
    calls: int = 0  # the real scheduler's manager calls in the compared steps
    calls_agreed: int = 0
    difference: str | None = None  # the kind of the first difference (None: the whole run agrees)
    detail: str = ""


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


def _by_phase(calls: list[Call]) -> dict[str, list[O.Op]]:
    out: dict[str, list[O.Op]] = {p: [] for p in PHASES}
    for phase, op in calls:
        out[phase].append(op)
    return out


def _request_of(op: O.Op) -> str:
    return str(getattr(op, "request_id", ""))


@dataclass(frozen=True)
class Difference:
    """Where one engine step's calls differ: ``kind`` for the summary, ``detail`` in full."""

    kind: str
    detail: str


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


def compare_run(family: str, seed: int, max_engine_steps: int = 200) -> RunAgreement:
    """Run ``family`` from ``seed`` on the real scheduler, replay it on the model, compare."""
    ch = SeededChoices(random.Random(seed))
    config = draw_config(ch, family)
    knobs = draw_knobs(ch, config, family)
    sched, spec_config = build_scheduler(config, knobs)
    log = CallLog()
    install(sched, log)

    def on_phase(phase: str) -> None:
        log.phase = phase

    driver = Driver(sched, spec_config, knobs, ch, on_phase=on_phase)
    real_steps: list[list[Call]] = []
    for _ in range(max_engine_steps):
        start = len(log.calls)
        driver.step()
        real_steps.append(log.calls[start:])
    assert driver.world is not None
    return replay_on_model(family, seed, spec_config, knobs, driver.world, real_steps)


def replay_on_model(
    family: str,
    seed: int,
    config: KVCacheConfig,
    knobs: SchedKnobs,
    world: list[WorldStep],
    real_steps: list[list[Call]],
) -> RunAgreement:
    """Drive kvspec's scheduler model through the recorded ``world`` against the spec and compare
    its manager calls with ``real_steps`` step by step."""
    target = SpecTarget()
    target.reset(config)
    model_calls: list[Call] = []
    phase = ["world"]

    def emit(op: O.Op) -> Any:
        out = target.apply(op)
        if isinstance(op, MANAGER_OPS):
            model_calls.append((phase[0], op))
            if isinstance(op, O.GetComputedBlocks):
                answers.hits[op.request_id] = out["num_hit_tokens"]
        return out

    answers = WorldAnswers(knobs)
    model = Scheduler(model_config(config, knobs), emit, answers, lambda rid: target.observe().tables[0].get(rid, ()))
    answers.model = model
    model.transfers.load_reservation = target.load_reservation
    res = RunAgreement(family, seed, engine_steps=len(world))
    for step, real in zip(world, real_steps, strict=True):
        start = len(model_calls)
        try:
            _model_step(model, answers, step, real, emit, phase)
        except (Unanswerable, AssertionError, KeyError, ValueError) as e:
            res.difference = f"the model could not replay the step ({type(e).__name__})"
            res.detail = f"step {res.steps_agreed}: {type(e).__name__}: {e}"
            res.calls += len(real)
            break
        res.calls += len(real)
        diff = compare_step(real, model_calls[start:])
        if diff is not None:
            res.difference = diff.kind
            res.detail = f"step {res.steps_agreed}: {diff.detail}"
            break
        res.steps_agreed += 1
        res.calls_agreed += len(real)
    return res


def _model_step(
    model: Scheduler, answers: WorldAnswers, step: WorldStep, real: list[Call], emit: Any, phase: list[str]
) -> None:
    """One recorded engine step on the model: the world's actions, ``schedule()``, the output."""
    answers.begin(step)
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


@dataclass
class Agreement:
    """Runs compared, summed."""

    runs: list[RunAgreement] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        runs = self.runs
        steps = sum(r.engine_steps for r in runs)
        kinds = Counter(r.difference for r in runs if r.difference)
        return {
            "runs": len(runs),
            "runs_agreeing": sum(r.difference is None for r in runs),
            "engine_steps": steps,
            "steps_agreed": sum(r.steps_agreed for r in runs),
            "calls_compared": sum(r.calls for r in runs),
            "calls_agreed": sum(r.calls_agreed for r in runs),
            "first_differences": dict(kinds.most_common()),
            "by_family": {
                f: f"{sum(r.difference is None for r in runs if r.family == f)}/{sum(r.family == f for r in runs)}"
                for f in sorted({r.family for r in runs})
            },
            "skipped": dict(self.skipped),
        }


def measure(families: Sequence[str], seconds: float, seed: int, max_engine_steps: int = 200) -> Agreement:
    """Compare runs of ``families`` in turn (run ``i`` seeded as ``kvspec fuzz`` seeds it) until
    ``seconds`` are spent."""
    from harness.targets.base import Unsupported
    from harness.vllm_sched.fuzz import run_seed

    out = Agreement()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        family = families[i % len(families)]
        s = run_seed(seed, i)
        i += 1
        try:
            out.runs.append(compare_run(family, s, max_engine_steps))
        except Unsupported as e:
            out.skipped[f"{family}: {e}"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.vllm_sched.agreement",
        description="kvspec's scheduler model against vLLM's real scheduler: same inputs, manager calls compared",
    )
    ap.add_argument("--family", default="all", help=f"comma-separated, or all ({', '.join(SCHED_FAMILIES)})")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200, help="engine steps per run")
    ap.add_argument("--show", type=int, default=3, help="print the first N differences in full")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    families = list(SCHED_FAMILIES) if args.family == "all" else args.family.split(",")
    unknown = [f for f in families if f not in SCHED_FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown} (known: {', '.join(SCHED_FAMILIES)})")
    if not (args.seconds > 0 and args.steps > 0):
        ap.error("--seconds and --steps must be > 0")
    result = measure(families, args.seconds, args.seed, args.steps)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        s = summary
        print(
            f"runs {s['runs']}: {s['runs_agreeing']} agree whole; engine steps {s['steps_agreed']}/{s['engine_steps']} "
            f"({100 * s['steps_agreed'] / max(s['engine_steps'], 1):.1f}%) agree; manager calls "
            f"{s['calls_agreed']}/{s['calls_compared']} ({100 * s['calls_agreed'] / max(s['calls_compared'], 1):.1f}%)"
        )
        print("agreeing runs by family: " + ", ".join(f"{f} {v}" for f, v in s["by_family"].items()))
        for kind, n in s["first_differences"].items():
            print(f"  first difference x{n}: {kind}")
        for r in [r for r in result.runs if r.difference][: args.show]:
            print(f"- {r.family} seed {r.seed}: {r.detail[:2000]}")
        for why, n in s["skipped"].items():
            print(f"  skipped x{n}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
