"""The per-call timeout (``harness.check.timeout``): the watchdog thread interrupts a call that runs past
its deadline, and only that call."""

from __future__ import annotations

import time

import pytest

from kvspec.harness.check.timeout import WATCHDOG, StepTimeout, call_with_timeout


def _busy(seconds: float) -> str:
    """Python code that never returns by itself within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "ran to the end"


@pytest.mark.parametrize("hang", [lambda: time.sleep(5), lambda: _busy(5)], ids=["sleeping", "busy"])
def test_a_hung_call_is_interrupted(hang):
    t0 = time.monotonic()
    with pytest.raises(StepTimeout):
        call_with_timeout(hang, 0.2)
    assert time.monotonic() - t0 < 3


def test_calls_that_return_are_never_interrupted():
    for i in range(2000):
        assert call_with_timeout(lambda i=i: i * 2, 0.5) == i * 2
    time.sleep(0.3)  # a signal sent late for one of them would land here, outside any call
    assert call_with_timeout(_busy, 1.0, 0.3) == "ran to the end"


def test_a_late_signal_is_ignored():
    WATCHDOG.current = None
    WATCHDOG.on_alarm(14, None)  # no call under way: nothing to interrupt


def test_a_call_inside_another_keeps_the_outer_deadline():
    def outer() -> str:
        assert call_with_timeout(lambda: "inner", 10.0) == "inner"
        return _busy(3)

    t0 = time.monotonic()
    with pytest.raises(StepTimeout):
        call_with_timeout(outer, 0.3)
    assert time.monotonic() - t0 < 2.5
