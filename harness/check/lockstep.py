"""Drive the reference spec and a target in lockstep, one operation at a time.

Every operation is applied to the spec (the reference, in-process) and to the target; every call
into the target runs under the guard (``harness.check.guard``: a per-step timeout, and whatever it
raises a finding).  Then, in this order: the outcomes are compared with the configured relation,
the observations are compared, ``spec.invariants`` runs on the spec state,
``harness.check.obs_invariants`` on the target's observation, and the KV ledger
(``harness.ledger.checker``, on by default: every read of a computed token holds its own KV) on the
target's tables.  The first problem raises ``FindingError`` carrying a ``Finding``: the step, the
operation, both outcomes, a one-sentence message and the smallest witness
(``harness.check.witness``: the blocks and requests involved, before and after).  A target that
raises or hangs is a finding too, never a harness crash; so is one whose outcome or observation does
not have the documented form (``target-malformed``, checked by ``harness.targets.outcome_schema`` as
soon as the call returns), and one that runs out of memory or grows past its bound
(``CheckSettings.memory_mb``; ``target-memory``, ``harness.check.memory_guard``).  What is checked and
how is one ``harness.check.settings.CheckSettings`` value, passed in.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any, NoReturn, TypeVar

from kvspec.harness.check.finding import Finding, FindingError
from kvspec.harness.check.glimpsing import glimpses
from kvspec.harness.check.guard import Call, guarded_call, malformed
from kvspec.harness.check.memory_guard import MemoryGuard
from kvspec.harness.check.obs_invariants import EventLedger, ObsContext, check_observation
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.check.unchanged import LastInputs
from kvspec.harness.check.witness import Step, outcome_blocks, state_finding
from kvspec.harness.core import ops as O
from kvspec.harness.core.equality import ObsDiff, get_relation, observation_differences, outcome_difference
from kvspec.harness.core.flight import FLIGHT
from kvspec.harness.core.glimpse import full_check_every as get_full_check_every
from kvspec.harness.core.glimpse import glimpse_differences, glimpse_to_json, has_glimpse
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.ledger.checker import LedgerChecker
from kvspec.harness.ledger.finding import LedgerFinding
from kvspec.harness.ledger.known_bugs import KnownBug, NamedViolation, match_known_bug, split_known
from kvspec.harness.targets import outcome_schema as S
from kvspec.harness.targets.base import Target, Unsupported, bind_release, get_target_engine
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.invariants import StepContext, Violation, check_invariants, check_step

V = TypeVar("V", bound=NamedViolation)  # an invariant violation, of the spec's state or of an observation

__all__ = ["CheckSettings", "Finding", "FindingError", "Lockstep"]


class Lockstep:
    """One run: a fresh reference and a fresh target for ``config``; ``apply`` steps both, checked as
    ``checks`` says (``harness.check.settings.CheckSettings``: the relation, the step timeout, the KV
    ledger, known bugs strict or counted, the target's memory bound, how often whole observations are
    compared)."""

    def __init__(
        self,
        config: KVCacheConfig,
        target: Target,
        checks: CheckSettings = DEFAULT_CHECKS,
        check_spec_invariants: bool = True,
    ) -> None:
        self.config = config = bind_release(config, target)  # both sides model the target's release
        self.target = target
        self.checks = checks
        self.relation = get_relation(checks.relation)
        self.step_timeout = checks.step_timeout
        self.check_spec_invariants = check_spec_invariants
        self.ref: SpecTarget | None = SpecTarget() if self.relation.uses_reference else None
        # The scheduler's requests (what the target's invariants are checked against): the
        # reference's own, or, when the spec does not run, a spec target fed the request ops only.
        self.book = self.ref if self.ref is not None else SpecTarget()
        self.steps: list[tuple[O.Op, Any]] = []
        self.ctx = ObsContext(engine=get_target_engine(target))
        self.ledger = EventLedger() if config.enable_kv_cache_events else None
        self.ref_obs: Observation | None = None
        self.tgt_obs: Observation | None = None
        self.op_counts: dict[str, int] = {}
        self.event_log: list[Any] = []  # the reference's events taken so far (spec §9.20)
        self.kv_ledger = LedgerChecker(config) if checks.ledger else None
        self.strict_known = checks.strict_known
        self.known_hits: Counter[str] = Counter()  # known bug id -> ledger findings matching it
        self.known_first: dict[str, tuple[Finding, list[tuple[O.Op, Any]]]] = {}
        self.muted: set[str] = set()  # invariants a known bug of this release broke (not checked again)
        self.ended_by_known: str | None = None  # the known bug that ended this example
        self.memory = MemoryGuard(checks.memory_mb or None)
        # Incremental checking (``harness.core.glimpse``): glimpses after most operations, a full check
        # every ``full_every`` operations and at ``finish``; needs the spec and a glimpsing target.
        self.full_every = get_full_check_every(config.num_blocks, checks.full_check_every)
        self.incremental = (
            self.full_every > 1 and self.ref is not None and self.relation.compare_observations and has_glimpse(target)
        )
        self.since_full, self.last_state_check = 0, LastInputs()
        self.tgt_obs_is_spec = False  # tgt_obs is the spec's observation (glimpsed steps)

    # --- setup ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Reset both for the config and take their first observations."""
        self.book.reset(self.config)
        guarded_call(Call("reset()", None), self.step_timeout, self.target.reset, self.config)
        self.ref_obs = self.ref.observe() if self.ref is not None else None
        self.tgt_obs = self._observe_target(None, None)
        self.memory.start()
        if self.kv_ledger is not None:
            self.kv_ledger.start(self.tgt_obs)

    # --- one operation -------------------------------------------------------------------------

    def apply(self, op: O.Op) -> Any:
        """Apply ``op`` to both; return the outcome the scheduler acts on (equal on both sides)."""
        i = self._count(op)
        ref_out = self._apply_reference(i, op)
        FLIGHT.op(op)
        tgt_out = self._call_target(i, op, ref_out)
        self._check_outcome_form(i, op, ref_out, tgt_out)
        self.steps.append((op, ref_out if self.ref is not None else tgt_out))
        step = Step(i, op, ref_out, tgt_out)
        self._check_memory(step)
        self._compare_outcomes(step)
        self._check_state(step)
        return tgt_out

    def finish(self) -> None:
        """The end of a run: one full check if the last operations were checked by glimpses only,
        so nothing a glimpse cannot see goes unchecked (a finding names the last step)."""
        if self.since_full and self.steps and self.ended_by_known is None:
            op, out = self.steps[-1]
            self._full_check(Step(len(self.steps) - 1, op, out, out), ledger=False)

    def _count(self, op: O.Op) -> int:
        """The operation's index; counted by kind, and given to the book when the spec does not run
        (the book rejecting it, e.g. an operation on a request never added, is a ``reference-raised``
        finding, as the spec's rejection is under the other relations)."""
        self.op_counts[op.op] = self.op_counts.get(op.op, 0) + 1
        i = len(self.steps)
        if self.ref is None and isinstance(op, O.REQUEST_OPS):
            try:
                self.book.apply(op)
            except Exception as e:
                self.steps.append((op, None))
                message = f"the scheduler's request book rejected the operation: {type(e).__name__}: {e}"
                finding = Finding("reference-raised", i, message, op_to_json(op), traceback=traceback.format_exc())
                raise FindingError(finding) from None
        return i

    def _apply_reference(self, i: int, op: O.Op) -> Any:
        """The spec's outcome (None when it does not run); the spec rejecting the operation is a
        ``reference-raised`` finding."""
        if self.ref is None:
            return None
        try:
            return self.ref.apply(op)
        except Exception as e:
            self.steps.append((op, None))
            message = f"the spec rejected the operation: {type(e).__name__}: {e}"
            finding = Finding("reference-raised", i, message, op_to_json(op), traceback=traceback.format_exc())
            raise FindingError(finding) from None

    def _call_target(self, i: int, op: O.Op, ref_out: Any) -> Any:
        """The target's outcome, under the guard (``harness.check.guard``); a finding ends the trace
        with this step."""
        try:
            return guarded_call(Call("the target", i, op, ref_out), self.step_timeout, self.target.apply, op)
        except FindingError:
            self.steps.append((op, ref_out))
            raise

    def _check_outcome_form(self, i: int, op: O.Op, ref_out: Any, tgt_out: Any) -> None:
        """The target's outcome has its documented form (``harness.targets.outcome_schema``)."""
        bad = S.outcome_problem(op, tgt_out, len(self.config.groups), self.config.num_blocks)
        if bad is not None:
            self.steps.append((op, ref_out))
            raise malformed(Call(f"the outcome of {op.op}", i, op), S.form_of(op), bad, S.short_repr(tgt_out))

    def _compare_outcomes(self, s: Step) -> None:
        """Both outcomes equal, when the relation compares them."""
        diff = outcome_difference(s.expected, s.actual) if self.relation.compare_outcomes else None
        if diff is not None:
            self._fail(s, "divergence", f"outcome differs: {diff}", outcome_blocks(s.expected, s.actual))

    def _check_state(self, s: Step) -> None:
        """The states after the operation: only the KV ledger when it changes no observation, a
        glimpse when one suffices, else everything."""
        if not O.changes_observation(s.op):
            self._check_ledger(s, self.tgt_obs)
        elif self._glimpse_suffices(s.op):
            self._glimpse_check(s)
        else:
            self._full_check(s)

    # --- full and glimpse checks ---------------------------------------------------------------

    def _glimpse_suffices(self, op: O.Op) -> bool:
        """Whether this operation is checked by a glimpse (``harness.core.glimpse``): incremental
        checking is on, the operation names a request, and no full check is due."""
        if not self.incremental or not getattr(op, "request_id", None):
            return False
        self.since_full += 1
        return self.since_full < self.full_every

    def _full_check(self, s: Step, ledger: bool = True) -> None:
        """Whole observations compared, every invariant on both, then (``ledger``: unless the step
        was checked already) the KV-cache events and the KV ledger."""
        self.since_full = 0
        before_ref, before_tgt = self.ref_obs, self.tgt_obs
        ledger_before = before_tgt
        if self.tgt_obs_is_spec:  # the last steps were glimpsed: no whole target observation before
            before_tgt, self.tgt_obs_is_spec = None, False
        self.ref_obs = self.ref.observe() if self.ref is not None else None
        self.tgt_obs = self._observe_target(s.i, s.op)
        self._compare_observations(s, self.tgt_obs, before_ref, before_tgt)
        if self.ref is not None and self.check_spec_invariants:
            self._check_spec_invariants(s, before_ref, before_tgt)
        if isinstance(s.op, O.EvictBlocks):
            self.ctx.evicted_ever = True
        self._check_target_invariants(s, self.tgt_obs, before_ref, before_tgt, events=ledger)
        if ledger:
            self._check_ledger(s, ledger_before)

    def _compares_observations(self) -> bool:
        """Are whole observations compared with the spec's (the relation says so and the spec runs)?"""
        return self.relation.compare_observations and self.ref_obs is not None

    def _compare_observations(
        self, s: Step, tgt_obs: Observation, before_ref: Observation | None, before_tgt: Observation | None
    ) -> None:
        """The target's whole observation equals the spec's, when the relation compares them."""
        if self._compares_observations():
            assert self.ref_obs is not None
            self._fail_if_differs(s, observation_differences(self.ref_obs, tgt_obs), before_ref, before_tgt)

    def _check_target_invariants(
        self,
        s: Step,
        tgt_obs: Observation,
        before_ref: Observation | None,
        before_tgt: Observation | None,
        events: bool,
    ) -> None:
        """The spec's state invariants on the target's own observation, and (``events``) its
        KV-cache events against its blocks."""
        violations = []
        if not self._compares_observations():
            # Under an exact comparison the target's state equals the spec's, whose invariants
            # were just checked; otherwise the same predicates run on the target's own state.
            self.ctx.requests = self.book.requests
            violations = check_observation(tgt_obs, self.config, self.ctx)
        if events and self.ledger is not None and isinstance(s.op, O.TakeEvents) and isinstance(s.actual, list):
            self.ledger.feed(s.actual)
            violations += self.ledger.check(tgt_obs)
        violations = self._unknown(s, violations, "invariant", before_ref, before_tgt)
        if violations:
            v = violations[0]
            message = f"invariant {v.name} broken on the target: {v.message}"
            self._fail(s, "invariant", message, set(v.blocks), set(v.requests), before_ref, before_tgt, v.name)

    def _glimpse_check(self, s: Step) -> None:
        """Glimpses compared (what the operation can change, read in O(touched)), the spec's step
        invariants, then the KV ledger on the spec's observation: under an exact comparison it
        equals the target's on everything this step touched, and the next full check compares
        the rest."""
        assert self.ref is not None
        ref, tgt = glimpses(self.ref, self.target, s, self.step_timeout)  # harness.check.glimpsing
        before_ref = self.ref_obs
        self.ref_obs = self.ref.observe()
        self.tgt_obs, self.tgt_obs_is_spec = self.ref_obs, True
        diffs = glimpse_differences(ref, tgt)
        if diffs:
            self.tgt_obs = None
            witness = {"spec_glimpse": glimpse_to_json(ref), "target_glimpse": glimpse_to_json(tgt)}
            self._fail_if_differs(s, diffs, before_ref, None, witness)
        if self.check_spec_invariants:
            self._check_spec_invariants(s, before_ref, None, state=False)
        self._check_ledger(s, before_ref)

    # --- the target's reads, its memory, the spec's invariants and the KV ledger ---------------

    def _observe_target(self, i: int | None, op: O.Op | None) -> Observation:
        """The target's observation, read under the guard and checked for its form
        (``harness.targets.outcome_schema``)."""
        call = Call("observe()", i, op)
        obs = guarded_call(call, self.step_timeout, self.target.observe)
        bad = S.observation_problem(obs, len(self.config.groups), self.config.num_blocks)
        if bad is not None:
            raise malformed(call, S.OBSERVATION_FORM, bad, bad.got)
        return obs  # type: ignore[no-any-return]

    def _check_memory(self, s: Step) -> None:
        """The target's growth bound (``KVSPEC_TARGET_MEMORY_MB``), read every few steps."""
        grown = self.memory.growth(s.i)
        if grown is not None:
            message = self.memory.message(grown)
            raise FindingError(Finding("target-memory", s.i, message, op_to_json(s.op), s.expected, s.actual))

    def _check_spec_invariants(
        self, s: Step, before_ref: Observation | None, before_tgt: Observation | None, state: bool = True
    ) -> None:
        """The spec's invariants: the state predicates (``state``; full checks only, they walk the
        pool) and the operation's postconditions."""
        violations = self._unknown(s, self._spec_violations(s.op, state), "reference-invariant", before_ref, before_tgt)
        if violations:
            v = violations[0]
            message = f"spec invariant {v.name} broken: {v.message}"
            requests = {getattr(s.op, "request_id", "")} - {""}
            self._fail(s, "reference-invariant", message, set(), requests, before_ref, before_tgt, v.name)

    def _unknown(self, s: Step, found: list[V], kind: str, ref: Observation | None, tgt: Observation | None) -> list[V]:
        """``violations`` less those a known bug of the modelled release explains
        (``harness.ledger.known_bugs.split_known``): counted, the first kept for one report."""
        if self.strict_known:
            return found
        unknown, known = split_known(found, self.config.profile.release, self.muted)
        for bug, v in known:
            self.known_hits[bug.id] += 1
            if bug.id not in self.known_first:
                try:
                    msg = f"known bug {bug.id} ({bug.name}): invariant {v.name} broken: {v.message}"
                    blocks, requests = set(getattr(v, "blocks", ())), set(getattr(v, "requests", ()))
                    self._fail(s, kind, msg, blocks, requests, ref, tgt, v.name)
                except FindingError as e:
                    self.known_first[bug.id] = (e.finding, list(self.steps))
        if known and not unknown:  # what follows is the bug's aftermath (e.g. 0.28's inflated free count)
            self.ended_by_known = known[0][0].id
            raise Unsupported(f"the rest of this example follows known bug {self.ended_by_known}")
        return unknown

    def _spec_violations(self, op: O.Op, state: bool) -> list[Violation]:
        """The spec's broken invariants after ``op`` (its events logged first, spec §9.20)."""
        assert self.ref is not None
        if self.ref.last_call is not None and self.ref.last_call[1] == "take_events":
            self.event_log.extend(self.ref.last_call[3])
        evicted = self.ctx.evicted_ever or isinstance(op, O.EvictBlocks)
        violations = []
        if state:  # not again on the very inputs of the last passed check (harness.check.unchanged)
            ref, log = self.ref, self.event_log if self.config.enable_kv_cache_events else None
            check = partial(check_invariants, ref.state, ref.requests, evict_called=evicted, event_log=log)  # type: ignore[arg-type]
            violations = self.last_state_check.run(check, ref.state, ref.requests, evicted, len(self.event_log))
        if self.ref.last_call is not None:
            before, name, args, outcome, request = self.ref.last_call
            violations += check_step(StepContext(before, self.ref.state, name, args, outcome, request, evicted))
        return violations

    def _check_ledger(self, s: Step, before_tgt: Observation | None) -> None:
        """The KV ledger after the operation (docs/semantics.md §11): a broken rule is a ``kv-ledger``
        finding whose message starts with the stable description (``LedgerFinding.description``)."""
        if self.kv_ledger is None or self.tgt_obs is None:
            return
        f: LedgerFinding | None = self.kv_ledger.check(s.op, s.actual, before_tgt, self.tgt_obs)
        if f is None:
            return
        bug = None if self.strict_known else match_known_bug(f.signature)
        if bug is None:
            self._fail_ledger(s, f, f.summary, before_tgt)
        self._count_known_bug(s, f, bug, before_tgt)

    def _count_known_bug(self, s: Step, f: LedgerFinding, bug: KnownBug, before_tgt: Observation | None) -> None:
        """A known bug (``harness.ledger.known_bugs``): counted, its first occurrence kept for one
        report; the ledger's record no longer describes a correct cache, so it stops for this run."""
        self.known_hits[bug.id] += 1
        if bug.id not in self.known_first:
            try:
                self._fail_ledger(s, f, f"known bug {bug.id} ({bug.name}): {f.summary}", before_tgt)
            except FindingError as e:
                self.known_first[bug.id] = (e.finding, list(self.steps))
        self.kv_ledger = None

    # --- findings ------------------------------------------------------------------------------

    def _fail_if_differs(
        self,
        s: Step,
        diffs: Sequence[ObsDiff],
        before_ref: Observation | None,
        before_tgt: Observation | None,
        extra_witness: dict[str, Any] | None = None,
    ) -> None:
        """A ``divergence`` naming the first difference of the states after the operation, with the
        blocks and requests of all of them."""
        if diffs:
            blocks = {b for d in diffs for b in d.blocks}
            requests = {r for d in diffs for r in d.requests}
            message = f"state differs after the operation: {diffs[0].message}"
            self._fail(s, "divergence", message, blocks, requests, before_ref, before_tgt, extra_witness=extra_witness)

    def _fail_ledger(self, s: Step, f: LedgerFinding, message: str, before_tgt: Observation | None) -> NoReturn:
        """A ``kv-ledger`` finding for the ledger's finding ``f``."""
        blocks = {f.block} if f.block else set()
        self._fail(
            s, "kv-ledger", message, blocks, {f.request_id}, before_tgt=before_tgt, invariant=f.invariant, ledger=f
        )

    def _fail(
        self,
        s: Step,
        kind: str,
        message: str,
        blocks: set[int] | None = None,
        requests: set[str] | None = None,
        before_ref: Observation | None = None,
        before_tgt: Observation | None = None,
        invariant: str | None = None,
        ledger: LedgerFinding | None = None,
        extra_witness: dict[str, Any] | None = None,
    ) -> NoReturn:
        """Raise the finding of ``kind`` about step ``s`` (``harness.check.witness``), its witness
        drawn from every observation at hand, before and after the operation."""
        glimpsed = self.tgt_obs_is_spec  # the spec's observation stands in: not reported as the target's
        observations = {
            "spec_before": before_ref,
            "target_before": None if glimpsed else before_tgt,
            "spec_after": self.ref_obs,
            "target_after": None if glimpsed else self.tgt_obs,
        }
        finding = state_finding(s, kind, message, observations, blocks, requests, invariant, ledger, extra_witness)
        raise FindingError(finding)
