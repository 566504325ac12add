"""Deliberate bugs in kvspec's scheduler model (harness/world/scheduler.py), shared by the tests that
show they are found: by the agreement figure (test_agreement.py) and by the fuzz (test_spec_journal.py)."""

from __future__ import annotations

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.world.scheduler import Scheduler


def forget_frees_on_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberate bug in kvspec's scheduler model: a preemption emits no ``free``."""

    def preempt_without_free(self: Scheduler, r: object) -> None:
        emit = self.emit
        self.emit = lambda op: None if isinstance(op, O.Free) else emit(op)  # type: ignore[method-assign]
        try:
            original(self, r)
        finally:
            self.emit = emit  # type: ignore[method-assign]

    original = Scheduler.preempt
    monkeypatch.setattr(Scheduler, "preempt", preempt_without_free)
