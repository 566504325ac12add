"""Drive the reference spec and a target in lockstep, one operation at a time.

Every operation is applied to the spec (the reference, in-process) and to the target; the target's
call runs under a per-step timeout.  Then, in this order: the outcomes are compared with the
configured relation, the observations are compared, ``spec.invariants`` runs on the spec state,
``harness.check.obs_invariants`` on the target's observation, and the KV ledger (``harness.ledger.checker``, on by
default: every read of a computed token holds its own KV) on the target's tables.  The first problem raises
``FindingError`` carrying a ``Finding``: the step, the operation, both outcomes, a one-sentence
message and the smallest witness (the blocks and requests involved, before and after).  A target
that raises or hangs is a finding too, never a harness crash; so is one whose outcome or observation
does not have the documented form (``target-malformed``, checked by ``harness.targets.outcome_schema`` as
soon as the call returns), and one that runs out of memory or grows past ``KVSPEC_TARGET_MEMORY_MB``
(``target-memory``, ``harness.check.memory_guard``).
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from typing import Any

from harness.check.finding import Finding, FindingError, StepTimeout, call_with_timeout, obs_to_json
from harness.check.memory_guard import MemoryGuard, bound_from_env, memory_error_message
from harness.check.obs_invariants import EventLedger, ObsContext, check_observation
from harness.core import ops as O
from harness.core.equality import get_relation, observation_differences, outcome_difference
from harness.core.glimpse import Glimpse, block_keys, glimpse_differences, glimpse_to_json, has_glimpse, touched_blocks
from harness.core.glimpse import full_check_every as get_full_check_every
from harness.core.observation import Observation
from harness.ledger.checker import LedgerChecker
from harness.ledger.finding import LedgerFinding
from harness.ledger.known_bugs import match_known_bug
from harness.ledger.known_bugs import strict_known as is_strict_known
from harness.targets import outcome_schema as S
from harness.targets.base import Target, Unsupported
from harness.targets.spec import SpecTarget
from spec.config import KVCacheConfig
from spec.invariants import StepContext, check_invariants, check_step

__all__ = ["Finding", "FindingError", "Lockstep", "StepTimeout", "call_with_timeout", "ledger_enabled", "obs_to_json"]


def ledger_enabled() -> bool:
    """The KV ledger's default: on, unless ``KVSPEC_LEDGER=0`` (``kvspec fuzz --no-ledger`` sets it)."""
    return os.environ.get("KVSPEC_LEDGER", "1") != "0"


class Lockstep:
    """One run: a fresh reference and a fresh target for ``config``; ``apply`` steps both.

    ``ledger``: run the KV ledger on the target (None: ``ledger_enabled()``); ``strict_known``: a ledger
    finding that matches a known bug (``harness.ledger.known_bugs``) is a finding too, not only counted (None:
    ``KVSPEC_STRICT_KNOWN``); ``memory_mb``: the target's memory growth bound in MiB (None:
    ``KVSPEC_TARGET_MEMORY_MB``; 0: off); ``full_check_every``: whole observations compared every
    that many operations, glimpses in between (None: ``harness.core.glimpse.full_check_every``)."""

    def __init__(
        self,
        config: KVCacheConfig,
        target: Target,
        relation: str = "exact",
        step_timeout: float | None = 10.0,
        check_spec_invariants: bool = True,
        ledger: bool | None = None,
        strict_known: bool | None = None,
        memory_mb: float | None = None,
        full_check_every: int | None = None,
    ) -> None:
        self.config = config
        self.target = target
        self.relation = get_relation(relation)
        self.step_timeout = step_timeout
        self.check_spec_invariants = check_spec_invariants
        self.ref: SpecTarget | None = SpecTarget() if self.relation.uses_reference else None
        # The scheduler's requests (what the target's invariants are checked against): the
        # reference's own, or, when the spec does not run, a spec target fed the request ops only.
        self.book = self.ref if self.ref is not None else SpecTarget()
        self.steps: list[tuple[O.Op, Any]] = []
        self.ctx = ObsContext()
        self.ledger = EventLedger() if config.enable_kv_cache_events else None
        self.ref_obs: Observation | None = None
        self.tgt_obs: Observation | None = None
        self.op_counts: dict[str, int] = {}
        self.event_log: list[Any] = []  # the reference's events taken so far (spec §9.20)
        self.kv_ledger = LedgerChecker(config) if (ledger_enabled() if ledger is None else ledger) else None
        self.strict_known = is_strict_known() if strict_known is None else strict_known
        self.known_hits: Counter[str] = Counter()  # known bug id -> ledger findings matching it
        self.known_first: dict[str, tuple[Finding, list[tuple[O.Op, Any]]]] = {}
        self.memory = MemoryGuard(bound_from_env() if memory_mb is None else (memory_mb or None))
        # Incremental checking (``harness.core.glimpse``): glimpses after most operations, a full check
        # every ``full_every`` operations and at ``finish``; needs the spec and a glimpsing target.
        self.full_every = get_full_check_every(config.num_blocks, full_check_every)
        self.incremental = (
            self.full_every > 1 and self.ref is not None and self.relation.compare_observations and has_glimpse(target)
        )
        self.since_full = 0
        self.tgt_obs_is_spec = False  # tgt_obs is the spec's observation (glimpsed steps)

    # --- setup ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.book.reset(self.config)
        try:
            call_with_timeout(self.target.reset, self.step_timeout, self.config)
        except StepTimeout:
            raise FindingError(
                Finding("target-hung", None, f"reset() did not return within {self.step_timeout}s")
            ) from None
        except MemoryError as e:
            raise FindingError(Finding("target-memory", None, memory_error_message("reset()", e))) from None
        except (Unsupported, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit from a target is a finding, not an exit
            raise FindingError(
                Finding(
                    "target-raised", None, f"reset() raised {type(e).__name__}: {e}", traceback=traceback.format_exc()
                )
            ) from None
        self.ref_obs = self.ref.observe() if self.ref is not None else None
        self.tgt_obs = self._observe_target(None, None)
        self.memory.start()
        if self.kv_ledger is not None:
            self.kv_ledger.start(self.tgt_obs)

    # --- one operation -------------------------------------------------------------------------

    def apply(self, op: O.Op) -> Any:
        """Apply ``op`` to both; return the outcome the scheduler acts on (equal on both sides)."""
        i = len(self.steps)
        self.op_counts[op.op] = self.op_counts.get(op.op, 0) + 1
        if self.ref is None and isinstance(op, O.REQUEST_OPS):
            self.book.apply(op)
        ref_out = None
        if self.ref is not None:
            try:
                ref_out = self.ref.apply(op)
            except Exception as e:
                self.steps.append((op, None))
                raise FindingError(
                    Finding(
                        "reference-raised",
                        i,
                        f"the spec rejected the operation: {type(e).__name__}: {e}",
                        O.op_to_json(op),
                        traceback=traceback.format_exc(),
                    )
                ) from None
        try:
            tgt_out = call_with_timeout(self.target.apply, self.step_timeout, op)
        except Unsupported:
            raise
        except StepTimeout:
            self.steps.append((op, ref_out))
            raise FindingError(
                Finding(
                    "target-hung",
                    i,
                    f"the target did not return within {self.step_timeout}s",
                    O.op_to_json(op),
                    expected=ref_out,
                )
            ) from None
        except MemoryError as e:
            self.steps.append((op, ref_out))
            raise FindingError(
                Finding("target-memory", i, memory_error_message("the target", e), O.op_to_json(op), expected=ref_out)
            ) from None
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit from a target is a finding, not an exit
            self.steps.append((op, ref_out))
            kv = getattr(e, "finding", None)
            if kv is not None and hasattr(kv, "to_markdown"):  # harness.oracle.target.KVMismatch
                raise FindingError(
                    Finding(
                        "kv-mismatch",
                        i,
                        kv.summary,
                        O.op_to_json(op),
                        expected=ref_out,
                        blocks=list(kv.block_ids),
                        requests=[kv.request_id],
                        kv=kv.to_json(),
                        kv_markdown=kv.to_markdown(),
                    )
                ) from None
            raise FindingError(
                Finding(
                    "target-raised",
                    i,
                    f"the target raised {type(e).__name__}: {e}",
                    O.op_to_json(op),
                    expected=ref_out,
                    traceback=traceback.format_exc(),
                )
            ) from None
        bad = S.outcome_problem(op, tgt_out, len(self.config.groups), self.config.num_blocks)
        if bad is not None:
            self.steps.append((op, ref_out))
            raise self._malformed(i, op, f"the outcome of {op.op}", S.form_of(op), bad, S.short_repr(tgt_out))
        self.steps.append((op, ref_out if self.ref is not None else tgt_out))
        self._check_memory(i, op, ref_out, tgt_out)
        if self.relation.compare_outcomes:
            diff = outcome_difference(ref_out, tgt_out)
            if diff is not None:
                self._fail(
                    "divergence",
                    i,
                    op,
                    f"outcome differs: {diff}",
                    ref_out,
                    tgt_out,
                    blocks=_outcome_blocks(ref_out, tgt_out),
                )
        if not O.changes_observation(op):
            self._check_ledger(i, op, ref_out, tgt_out, self.tgt_obs)
            return tgt_out
        if self._glimpse_suffices(op):
            self._glimpse_check(i, op, ref_out, tgt_out)
        else:
            self._full_check(i, op, ref_out, tgt_out)
        return tgt_out

    def finish(self) -> None:
        """The end of a run: one full check if the last operations were checked by glimpses only,
        so nothing a glimpse cannot see goes unchecked (a finding names the last step)."""
        if self.since_full and self.steps:
            op, out = self.steps[-1]
            self._full_check(len(self.steps) - 1, op, out, out, ledger=False)

    # --- full and glimpse checks ---------------------------------------------------------------

    def _glimpse_suffices(self, op: O.Op) -> bool:
        """Whether this operation is checked by a glimpse (``harness.core.glimpse``): incremental
        checking is on, the operation names a request, and no full check is due."""
        if not self.incremental or not getattr(op, "request_id", None):
            return False
        self.since_full += 1
        return self.since_full < self.full_every

    def _full_check(self, i: int, op: O.Op, ref_out: Any, tgt_out: Any, ledger: bool = True) -> None:
        """Whole observations compared, every invariant on both, then the KV ledger."""
        self.since_full = 0
        before_ref, before_tgt = self.ref_obs, self.tgt_obs
        ledger_before = before_tgt
        if self.tgt_obs_is_spec:  # the last steps were glimpsed: no whole target observation before
            before_tgt, self.tgt_obs_is_spec = None, False
        self.ref_obs = self.ref.observe() if self.ref is not None else None
        self.tgt_obs = self._observe_target(i, op)
        if self.relation.compare_observations and self.ref_obs is not None:
            diffs = observation_differences(self.ref_obs, self.tgt_obs)
            if diffs:
                d = diffs[0]
                blocks = {b for x in diffs for b in x.blocks}
                reqs = {r for x in diffs for r in x.requests}
                self._fail(
                    "divergence",
                    i,
                    op,
                    f"state differs after the operation: {d.message}",
                    ref_out,
                    tgt_out,
                    blocks,
                    reqs,
                    before_ref,
                    before_tgt,
                )
        if self.ref is not None and self.check_spec_invariants:
            self._check_spec_invariants(i, op, ref_out, tgt_out, before_ref, before_tgt)
        if isinstance(op, O.EvictBlocks):
            self.ctx.evicted_ever = True
        violations = []
        if not (self.relation.compare_observations and self.ref_obs is not None):
            # Under an exact comparison the target's state equals the spec's, whose invariants
            # were just checked; otherwise the same predicates run on the target's own state.
            self.ctx.requests = self.book.requests
            violations = check_observation(self.tgt_obs, self.config, self.ctx)
        if ledger and self.ledger is not None and isinstance(op, O.TakeEvents) and isinstance(tgt_out, list):
            self.ledger.feed(tgt_out)
            violations += self.ledger.check(self.tgt_obs)
        if violations:
            v = violations[0]
            self._fail(
                "invariant",
                i,
                op,
                f"invariant {v.name} broken on the target: {v.message}",
                ref_out,
                tgt_out,
                set(v.blocks),
                set(v.requests),
                before_ref,
                before_tgt,
                invariant=v.name,
            )
        if ledger:
            self._check_ledger(i, op, ref_out, tgt_out, ledger_before)

    def _glimpse_check(self, i: int, op: O.Op, ref_out: Any, tgt_out: Any) -> None:
        """Glimpses compared (what the operation can change, read in O(touched)), the spec's step
        invariants, then the KV ledger on the spec's observation: under an exact comparison it
        equals the target's on everything this step touched, and the next full check compares
        the rest."""
        assert self.ref is not None
        rid = str(getattr(op, "request_id", ""))
        # A request operation (arrival, appended tokens) makes no manager call: no state before it.
        before_state = self.ref.state if self.ref.last_call is None else self.ref.last_call[0]
        blocks = touched_blocks(before_state, self.ref.state, rid) | _outcome_blocks(ref_out, tgt_out)
        keys = block_keys(before_state, blocks) | block_keys(self.ref.state, blocks)
        tgt = self._target_glimpse(i, op, rid, blocks, keys)
        more_blocks = blocks | set(tgt.blocks)
        more_keys = keys | tgt.block_keys() | block_keys(self.ref.state, more_blocks - blocks)
        if more_blocks != blocks or more_keys != keys:
            tgt = self._target_glimpse(i, op, rid, more_blocks, more_keys)
        ref = self.ref.glimpse([rid], more_blocks, more_keys)
        before_ref = self.ref_obs
        self.ref_obs = self.ref.observe()
        self.tgt_obs, self.tgt_obs_is_spec = self.ref_obs, True
        diffs = glimpse_differences(ref, tgt)
        if diffs:
            self.tgt_obs = None
            witness = {"spec_glimpse": glimpse_to_json(ref), "target_glimpse": glimpse_to_json(tgt)}
            self._fail(
                "divergence",
                i,
                op,
                f"state differs after the operation: {diffs[0].message}",
                ref_out,
                tgt_out,
                {b for d in diffs for b in d.blocks},
                {r for d in diffs for r in d.requests},
                before_ref,
                extra_witness=witness,
            )
        if self.check_spec_invariants:
            self._check_spec_invariants(i, op, ref_out, tgt_out, before_ref, None, state=False)
        self._check_ledger(i, op, ref_out, tgt_out, before_ref)

    def _target_glimpse(self, i: int, op: O.Op, rid: str, blocks: set[int], keys: set[bytes]) -> Glimpse:
        """The target's glimpse (``harness.core.glimpse``), read like ``observe()``."""
        glimpse = getattr(self.target, "glimpse", None)
        assert callable(glimpse), "glimpse checks need a target with glimpse()"
        out = self._read_target("glimpse()", i, op, glimpse, [rid], blocks, keys)
        if not isinstance(out, Glimpse):
            got = S.short_repr(out)
            raise self._malformed(
                i, op, "glimpse()", "a harness.core.glimpse.Glimpse", S.Malformed("glimpse()", "a Glimpse", got), got
            )
        return out

    # --- helpers -------------------------------------------------------------------------------

    def _check_ledger(self, i: int, op: O.Op, ref_out: Any, tgt_out: Any, before_tgt: Observation | None) -> None:
        """The KV ledger after the operation (docs/semantics.md §11): a broken rule is a ``kv-ledger``
        finding whose message starts with the stable description (``LedgerFinding.description``)."""
        if self.kv_ledger is None or self.tgt_obs is None:
            return
        f: LedgerFinding | None = self.kv_ledger.check(op, tgt_out, before_tgt, self.tgt_obs)
        if f is None:
            return
        blocks = {f.block} if f.block else set()
        bug = None if self.strict_known else match_known_bug(f.signature)
        if bug is None:
            self._fail(
                "kv-ledger",
                i,
                op,
                f.summary,
                ref_out,
                tgt_out,
                blocks,
                {f.request_id},
                before_tgt=before_tgt,
                invariant=f.invariant,
                ledger=f,
            )
            return
        # A known bug (harness.ledger.known_bugs): counted, its first occurrence kept for one report; the
        # ledger's record no longer describes a correct cache, so it stops for this run.
        assert bug is not None
        self.known_hits[bug.id] += 1
        if bug.id not in self.known_first:
            try:
                self._fail(
                    "kv-ledger",
                    i,
                    op,
                    f"known bug {bug.id} ({bug.name}): {f.summary}",
                    ref_out,
                    tgt_out,
                    blocks,
                    {f.request_id},
                    before_tgt=before_tgt,
                    invariant=f.invariant,
                    ledger=f,
                )
            except FindingError as e:
                self.known_first[bug.id] = (e.finding, list(self.steps))
        self.kv_ledger = None

    def _observe_target(self, i: int | None, op: O.Op | None) -> Observation:
        """The target's observation, checked for its form (``harness.targets.outcome_schema``)."""
        obs = self._read_target("observe()", i, op, self.target.observe)
        bad = S.observation_problem(obs, len(self.config.groups), self.config.num_blocks)
        if bad is not None:
            raise self._malformed(i, op, "observe()", S.OBSERVATION_FORM, bad, bad.got)
        return obs  # type: ignore[no-any-return]

    def _read_target(self, what: str, i: int | None, op: O.Op | None, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, a read of the target's state, under the step timeout; a hang, a
        ``MemoryError`` or an exception is a finding naming ``what``."""
        where = O.op_to_json(op) if op else None
        try:
            return call_with_timeout(fn, self.step_timeout, *args)
        except StepTimeout:
            raise FindingError(
                Finding("target-hung", i, f"{what} did not return within {self.step_timeout}s", where)
            ) from None
        except MemoryError as e:
            raise FindingError(Finding("target-memory", i, memory_error_message(what, e), where)) from None
        except Exception as e:
            raise FindingError(
                Finding(
                    "target-raised",
                    i,
                    f"{what} raised {type(e).__name__}: {e}",
                    where,
                    traceback=traceback.format_exc(),
                )
            ) from None

    def _malformed(
        self, i: int | None, op: O.Op | None, what: str, form: str, bad: S.Malformed, got: str
    ) -> FindingError:
        """A ``target-malformed`` finding: ``what`` departs from its documented form (``harness/targets/base.py``)."""
        return FindingError(
            Finding(
                "target-malformed",
                i,
                f"{what} does not have the documented form: {bad.sentence()}",
                O.op_to_json(op) if op else None,
                expected=form,
                actual=got,
            )
        )

    def _check_memory(self, i: int, op: O.Op, ref_out: Any, tgt_out: Any) -> None:
        """The target's growth bound (``KVSPEC_TARGET_MEMORY_MB``), read every few steps."""
        grown = self.memory.growth(i)
        if grown is not None:
            raise FindingError(
                Finding("target-memory", i, self.memory.message(grown), O.op_to_json(op), ref_out, tgt_out)
            )

    def _check_spec_invariants(
        self, i: int, op: O.Op, ref_out: Any, tgt_out: Any, before_ref: Any, before_tgt: Any, state: bool = True
    ) -> None:
        """The spec's invariants: the state predicates (``state``; full checks only, they walk the
        pool) and the operation's postconditions."""
        assert self.ref is not None
        if self.ref.last_call is not None and self.ref.last_call[1] == "take_events":
            self.event_log.extend(self.ref.last_call[3])
        violations = []
        if state:
            violations = check_invariants(
                self.ref.state,
                self.ref.requests,  # type: ignore[arg-type]  # str ids are RequestIds
                evict_called=self.ctx.evicted_ever or isinstance(op, O.EvictBlocks),
                event_log=self.event_log if self.config.enable_kv_cache_events else None,
            )
        if self.ref.last_call is not None:
            before, name, args, outcome, request = self.ref.last_call
            violations += check_step(
                StepContext(
                    before,
                    self.ref.state,
                    name,
                    args,
                    outcome,
                    request,
                    self.ctx.evicted_ever or isinstance(op, O.EvictBlocks),
                )
            )
        if violations:
            v = violations[0]
            self._fail(
                "reference-invariant",
                i,
                op,
                f"spec invariant {v.name} broken: {v.message}",
                ref_out,
                tgt_out,
                set(),
                {getattr(op, "request_id", "")} - {""},
                before_ref,
                before_tgt,
                invariant=v.name,
            )

    def _fail(
        self,
        kind: str,
        i: int,
        op: O.Op,
        message: str,
        expected: Any,
        actual: Any,
        blocks: set[int] | None = None,
        requests: set[str] | None = None,
        before_ref: Observation | None = None,
        before_tgt: Observation | None = None,
        invariant: str | None = None,
        ledger: LedgerFinding | None = None,
        extra_witness: dict[str, Any] | None = None,
    ) -> None:
        if self.tgt_obs_is_spec:  # glimpsed steps: the spec's observation stands in, not reported as the target's
            before_tgt = None
        blocks = set(blocks or ())
        requests = set(requests or ())
        rid = getattr(op, "request_id", None)
        if rid:
            requests.add(rid)
        # The blocks held by the requests involved belong to the witness too.
        for obs in (self.ref_obs, self.tgt_obs, before_ref, before_tgt):
            if obs is not None:
                for g in obs.tables:
                    for r in requests:
                        blocks.update(b for b in g.get(r, ()) if b)
        witness: dict[str, Any] = {} if ledger is None else {"ledger": ledger.to_json()}
        witness.update(extra_witness or {})
        for name, obs in (
            ("spec_before", before_ref),
            ("target_before", before_tgt),
            ("spec_after", self.ref_obs),
            ("target_after", None if self.tgt_obs_is_spec else self.tgt_obs),
        ):
            if obs is not None:
                witness[name] = obs_to_json(obs, blocks, requests)
        raise FindingError(
            Finding(
                kind,
                i,
                message,
                O.op_to_json(op),
                expected,
                actual,
                invariant,
                sorted(blocks),
                sorted(requests),
                witness,
                kv_markdown=None if ledger is None else ledger.to_markdown(),
            )
        )


def _outcome_blocks(a: Any, b: Any) -> set[int]:
    out: set[int] = set()
    for x in (a, b):
        if isinstance(x, dict):
            for g in x.get("block_ids", []):
                out.update(i for i in g if i)
    return out
