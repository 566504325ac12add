"""Deliberate bugs in kvspec's scheduler model (harness/world/scheduler.py), shared by the tests that
show they are found: by the agreement figure (test_agreement.py), by the fuzz (test_spec_journal.py) and
by its reduction (test_sched_reduce.py)."""

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


def drop_frees_in_engine_step(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """A deliberate bug in kvspec's scheduler model that one engine step alone shows: in engine step
    ``at`` of a run (and in no other) the model's frees are not emitted, so the agreement differs
    there whenever the real scheduler frees in that step, and nowhere else."""
    from kvspec.harness.vllm_sched.mirror import ModelMirror

    def step(self: ModelMirror, world_step: object, real: object, start: object = None) -> object:
        self.bug_step = getattr(self, "bug_step", -1) + 1  # type: ignore[attr-defined]
        model, emit = self.model, self.model.emit
        if self.bug_step == at:  # type: ignore[attr-defined]
            model.emit = lambda op: None if isinstance(op, O.Free) else emit(op)  # type: ignore[method-assign]
        try:
            return original(self, world_step, real, start)
        finally:
            model.emit = emit  # type: ignore[method-assign]

    original = ModelMirror.step
    monkeypatch.setattr(ModelMirror, "step", step)
