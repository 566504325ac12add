"""Targets that take their process down (tests/hostile/test_crashes.py runs them through ``kvspec``).

Each is the spec with one deliberate way to die, at a chosen place: ``segv`` (a read of address 0,
as a native extension's bug would), ``exit`` (``os._exit(3)``), ``abort`` (SIGABRT, as a failed C
``assert``), ``close`` (kvspec's standard streams closed, then a raise).  ``KVSPEC_CRASHY_MARK``
names a file: ``diverge_then_segv`` gives a wrong outcome at its third ``allocate_slots``, notes it
in that file, and every target made after that dies in ``reset`` (the crash comes while the finding
is being reduced).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from kvspec.harness.targets.spec import SpecTarget


class Crashy(SpecTarget):
    how = "segv"
    where = "apply"  # factory, reset, apply, observe
    after = 3  # the n-th allocate_slots (apply) or observe call

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        if self.where == "factory":
            self.die()

    def die(self) -> None:
        if self.how == "segv":
            ctypes.string_at(0)
        elif self.how == "exit":
            os._exit(3)
        elif self.how == "abort":
            os.abort()
        elif self.how == "interrupt":  # a KeyboardInterrupt of the target's own, no signal behind it
            raise KeyboardInterrupt
        elif self.how == "close":
            os.close(1)
            os.close(2)
            raise OSError(9, "closed")

    def reset(self, config: Any) -> None:
        if self.where == "reset":
            self.die()
        super().reset(config)

    def apply(self, op: Any) -> Any:
        if self.where == "apply" and op.op == "allocate_slots":
            self.calls += 1
            if self.calls >= self.after:
                self.die()
        return super().apply(op)

    def observe(self) -> Any:
        if self.where == "observe":
            self.calls += 1
            if self.calls >= self.after:
                self.die()
        return super().observe()


def _crashy(how: str, where: str) -> type[Crashy]:
    return type(f"Crashy_{how}_{where}", (Crashy,), {"how": how, "where": where})


segv_apply = _crashy("segv", "apply")
exit_apply = _crashy("exit", "apply")
abort_apply = _crashy("abort", "apply")
close_apply = _crashy("close", "apply")
segv_reset = _crashy("segv", "reset")
exit_observe = _crashy("exit", "observe")
segv_factory = _crashy("segv", "factory")
interrupt_apply = _crashy("interrupt", "apply")
interrupt_factory = _crashy("interrupt", "factory")


class DivergeThenSegv(SpecTarget):
    """A wrong outcome at the third ``allocate_slots`` (noted in ``KVSPEC_CRASHY_MARK``); once noted,
    every later target of the process tree dies in ``reset``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def reset(self, config: Any) -> None:
        if os.path.exists(os.environ["KVSPEC_CRASHY_MARK"]):
            ctypes.string_at(0)
        super().reset(config)

    def apply(self, op: Any) -> Any:
        out = super().apply(op)
        if op.op == "allocate_slots":
            self.calls += 1
            if self.calls == 3 and out is not None:
                open(os.environ["KVSPEC_CRASHY_MARK"], "w").close()
                return None
        return out


diverge_then_segv = DivergeThenSegv


def mutants() -> dict[str, Any]:
    """For ``kvspec mutants --target kvspec_crashy:Crashy``: one mutant that crashes, one that diverges."""
    return {"segfaults": segv_apply, "diverges": _Diverges}


class _Diverges(SpecTarget):
    def apply(self, op: Any) -> Any:
        out = super().apply(op)
        return None if op.op == "allocate_slots" and out is not None else out


plain = SpecTarget
