"""Every call into a target, guarded: what the call raises becomes the finding one table says, and
what it returns out of its documented form a ``target-malformed`` finding (``malformed``).

A target that hangs, runs out of memory, reports wrong KV contents or raises is a finding, never a
harness crash.  ``FINDINGS`` is the one table from what a call raised to the finding's kind and
form, read in order (the first row that matches wins); ``PROPAGATE`` lists what is no finding and
passes through: ``KeyboardInterrupt`` (the user stops the run) and ``Unsupported`` (the target does
not model this config or operation).  ``SystemExit`` from a target is a finding, not an exit.
``Lockstep`` guards ``reset()``, every operation and every read (``observe()``, ``glimpse()``) with it.
"""

from __future__ import annotations

import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvspec.harness.check.finding import Finding, FindingError, StepTimeout, call_with_timeout
from kvspec.harness.check.memory_guard import memory_error_message
from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.targets import outcome_schema as S
from kvspec.harness.targets.base import Unsupported

PROPAGATE: tuple[type[BaseException], ...] = (KeyboardInterrupt, Unsupported)


@dataclass(frozen=True)
class Call:
    """A guarded call, as its finding names it: ``what`` (``reset()``, ``the target``, ``observe()``),
    the step (None: setup), the operation (None: none) and the reference's outcome (``expected``)."""

    what: str
    step: int | None
    op: O.Op | None = None
    expected: Any = None

    def finding(self, kind: str, message: str, **more: Any) -> Finding:
        """A finding of ``kind`` about this call."""
        where = op_to_json(self.op) if self.op else None
        return Finding(kind, self.step, message, where, expected=self.expected, **more)


def _hung(call: Call, kind: str, e: BaseException, timeout: float | None) -> Finding:
    return call.finding(kind, f"{call.what} did not return within {timeout}s")


def _memory(call: Call, kind: str, e: BaseException, timeout: float | None) -> Finding:
    return call.finding(kind, memory_error_message(call.what, e))


def _kv_mismatch(call: Call, kind: str, e: BaseException, timeout: float | None) -> Finding:
    kv: Any = getattr(e, "finding")  # noqa: B009 - any exception carrying one (harness.oracle's KVMismatch)
    return call.finding(
        kind,
        kv.summary,
        blocks=list(kv.block_ids),
        requests=[kv.request_id],
        kv=kv.to_json(),
        kv_markdown=kv.to_markdown(),
    )


def _raised(call: Call, kind: str, e: BaseException, timeout: float | None) -> Finding:
    message = f"{call.what} raised {type(e).__name__}: {e}"
    return call.finding(kind, message, traceback="".join(traceback.format_exception(e)))


def _carries_kv_finding(e: BaseException) -> bool:
    """Does ``e`` carry a KV-content finding (``harness.oracle.target.KVMismatch``: a ``.finding``
    with ``to_markdown``)?"""
    return hasattr(getattr(e, "finding", None), "to_markdown")


@dataclass(frozen=True)
class Row:
    """One row of ``FINDINGS``: the finding's kind, which exceptions it takes, and how it reads."""

    kind: str
    matches: Callable[[BaseException], bool]
    finding: Callable[[Call, str, BaseException, float | None], Finding]


FINDINGS: tuple[Row, ...] = (
    Row("target-hung", lambda e: isinstance(e, StepTimeout), _hung),
    Row("target-memory", lambda e: isinstance(e, MemoryError), _memory),
    Row("kv-mismatch", _carries_kv_finding, _kv_mismatch),
    Row("target-raised", lambda e: True, _raised),  # anything else, SystemExit included
)


def finding_for(e: BaseException, call: Call, timeout: float | None) -> Finding:
    """The finding ``FINDINGS`` makes of ``e`` raised by ``call`` (its first matching row)."""
    row = next(r for r in FINDINGS if r.matches(e))
    return row.finding(call, row.kind, e, timeout)


def guarded_call(call: Call, timeout: float | None, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` under the per-step ``timeout``; whatever it raises, but ``PROPAGATE``, is
    raised as a ``FindingError`` carrying ``finding_for`` it."""
    try:
        return call_with_timeout(fn, timeout, *args)
    except PROPAGATE as e:
        if isinstance(e, KeyboardInterrupt) and not is_user_stop(e):
            raise FindingError(finding_for(e, call, timeout)) from None
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit from a target is a finding, not an exit
        raise FindingError(finding_for(e, call, timeout)) from None


def is_user_stop(e: KeyboardInterrupt) -> bool:
    """Did the user stop the run (so ``e`` passes through), or did the target raise
    ``KeyboardInterrupt`` itself?  Under a SIGINT handler of kvspec's own (``kvspec fuzz``: it only
    notes the signal; ``harness.run.signals``) a real Ctrl-C never raises inside a target call, so
    there ``e`` is the target's and a finding; under Python's default handler (a plain pytest run)
    it may be the user's, and stops the run."""
    carries_signal = getattr(e, "signum", None) is not None  # kvspec's own stop (``Interrupted``)
    return carries_signal or signal.getsignal(signal.SIGINT) is signal.default_int_handler


def malformed(call: Call, form: str, bad: S.Malformed, got: str) -> FindingError:
    """A ``target-malformed`` finding: what ``call`` returned (``got``) departs from its documented
    ``form`` (``harness/targets/base.py``, checked by ``harness.targets.outcome_schema``)."""
    message = f"{call.what} does not have the documented form: {bad.sentence()}"
    return FindingError(replace(call.finding("target-malformed", message), expected=form, actual=got))
