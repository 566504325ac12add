"""The world's own checks of vLLM's real scheduler: facts from outside the manager.

A lockstep of manager calls cannot see a bug whose calls are all legal (a scheduler that stops
calling ``free``, or that believes what it should not).  The driver (``harness.vllm_sched.driver``)
is the world: it plays the model runner and the KV connector, so it knows what no manager call says.
``WorldChecks`` turns that into checks, on by default in ``kvspec fuzz --target vllm-scheduler``:

1. **The world's facts are ledger facts** (``harness.ledger.world``): every load the connector
   finishes or fails (and for which blocks) and every token the model runner samples enters the KV
   ledger as the driver reports it; a position counted as computed whose KV never arrived, or arrived
   from a failed load, is a ``kv-ledger`` finding when it is read, and an appended token the model
   runner never sampled is one at once (``kv_sampled_is_appended``).
2. **Conservation at quiet moments** (after every engine step; SGLang checks available + evictable +
   in use = total when its engine is idle): every block the manager holds belongs to a request the
   world still considers live (added and neither aborted by the world nor reported finished in the
   engine's outputs), or to one freeing with a stated delay: a request aborted while its connector
   load is in flight keeps its blocks until the world reports that load finished.  The world ends
   every load within ``MAX_LOAD_STEPS`` engine steps, and the scheduler frees an aborted request's
   blocks in the step that reports its load's end, so a delay older than ``LEAK_BOUND`` steps never
   ends: a leak.  With no request live and no load in flight every block is free or evictable.
   A leak is a ``conservation`` finding naming the request and its blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvspec.harness.check.finding import Finding, FindingError
from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.ledger.world import WorldFacts
from kvspec.harness.vllm_sched.sink import LockstepSink

MAX_LOAD_STEPS = 8
"""The world (``Driver._connector_output``) reports every asynchronous load finished within this many
engine steps of its start."""
LEAK_BOUND = MAX_LOAD_STEPS + 1
"""A stated delay (an aborted request's load in flight) older than this many engine steps never ends:
the longest load the world runs, plus the step whose output reports its end."""


@dataclass
class Ended:
    """A request the world considers ended: when, and why."""

    step: int
    why: str


@dataclass
class WorldChecks:
    """Checks 1 and 2 of the module docstring for one run; ``sink`` is the run's lockstep."""

    sink: LockstepSink
    facts: bool = True
    conservation: bool = True
    ledger: WorldFacts | None = None
    added: set[str] = field(default_factory=set)
    ended: dict[str, Ended] = field(default_factory=dict)
    loads: dict[str, int] = field(default_factory=dict)  # request id -> engine step its load started
    step: int = 0

    def __post_init__(self) -> None:
        kv = self.sink.lockstep.kv_ledger
        self.ledger = None if kv is None or not self.facts else kv.world_facts()
        self.sink.world = self

    # --- facts, as the driver gives them to the scheduler ----------------------------------------

    def arrived(self, rid: str) -> None:
        self.added.add(rid)

    def aborted(self, rid: str) -> None:
        self.ended.setdefault(rid, Ended(self.step, "aborted by the world"))

    def load_started(self, rid: str) -> None:
        self.loads.setdefault(rid, self.step)

    def connector_output(self, done: Iterable[str], invalid: Iterable[int]) -> None:
        """The loads the connector reports finished this step, and the blocks it reports invalid."""
        for rid in done:
            self.loads.pop(rid, None)
            if self.ledger is not None:
                self.ledger.finished(rid)
        if self.ledger is not None:
            self.ledger.invalid(invalid)

    def sampled(self, samples: dict[str, tuple[int, ...]]) -> None:
        if self.ledger is not None:
            self.ledger.sampled(samples)

    def engine_outputs(self, outputs: Any) -> None:
        """The engine's outputs of ``update_from_output``: the requests it reports finished."""
        for eco in (outputs or {}).values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.ended.setdefault(o.request_id, Ended(self.step, f"finished ({o.finish_reason.name})"))

    # --- the checks ------------------------------------------------------------------------------

    def appended(self, op: O.Op) -> None:
        """Check 1 for sampled tokens: raised as a ``kv-ledger`` finding."""
        if self.ledger is None or not isinstance(op, O.AppendOutputTokens):
            return
        problem = self.ledger.appended_problem(op.request_id, tuple(op.token_ids))
        if problem is not None:
            self._raise("kv-ledger", "kv_sampled_is_appended", problem, op, [op.request_id], [])

    def end_of_step(self) -> None:
        """The lockstep's full check of the whole state, then check 2, after engine step ``self.step``;
        then the next step begins."""
        self.sink.finish()
        if self.conservation:
            self._conserved()
        self.step += 1

    def _conserved(self) -> None:
        obs = self.sink.observation()  # what the end-of-step full check just read
        held: dict[str, list[int]] = {}
        for tables in obs.tables:
            for rid, blocks in tables.items():
                held.setdefault(rid, []).extend(b for b in blocks if b)
        for rid, mine in sorted(held.items()):
            if not mine:
                continue
            end = self.ended.get(rid)
            if rid not in self.added:
                why = "a request the world never sent"
            elif end is None:
                continue
            elif rid in self.loads and self.step - self.loads[rid] <= LEAK_BOUND:
                continue  # freeing with a stated delay: its load is still in flight
            elif rid in self.loads:
                why = f"{end.why} at engine step {end.step}, its load (started at step {self.loads[rid]}) never ended"
            else:
                why = f"{end.why} at engine step {end.step}"
            self._raise(
                "conservation",
                "held_by_live_request",
                f"after engine step {self.step} the manager holds blocks {sorted(mine)} of {rid}, {why}",
                None,
                [rid],
                sorted(mine),
            )
        live = self.added - set(self.ended)
        if not live and not self.loads:
            in_use = [b for b in range(1, obs.num_blocks) if obs.ref_cnt[b] > 0]
            if in_use:
                self._raise(
                    "conservation",
                    "idle_pool_free",
                    f"after engine step {self.step} no request is live, yet blocks {in_use} are in use "
                    f"(free + evictable = {obs.num_blocks - 1 - len(in_use)} of {obs.num_blocks - 1})",
                    None,
                    [],
                    in_use,
                )

    def _raise(
        self, kind: str, invariant: str, message: str, op: O.Op | None, requests: list[str], blocks: list[int]
    ) -> None:
        steps = self.sink.steps
        last = op if op is not None else (steps[-1][0] if steps else None)
        raise FindingError(
            Finding(
                kind,
                max(len(steps) - 1, 0),
                message,
                None if last is None else op_to_json(last),
                invariant=invariant,
                requests=requests,
                blocks=blocks,
                witness={"engine_step": self.step, "check": "world"},
            )
        )
