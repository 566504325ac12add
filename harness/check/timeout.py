"""The per-call timeout of every call into a target (``harness.check.guard``), at the cost of two
attribute writes per call.

Arming an interval timer and swapping the ``SIGALRM`` handler around each call costs four system
calls, 10-20 µs: more than a vLLM manager call itself, and there are two or three such calls per
checked operation.  Instead one daemon thread, the watchdog, sleeps until the deadline of the call
under way; a call only publishes ``(call number, deadline)`` before it starts and clears it after.
When a deadline passes with its call still under way, the watchdog sends ``SIGALRM`` to the main
thread (a real signal: it also interrupts a blocking system call), whose handler raises
``StepTimeout`` there, unless that call has returned meanwhile (a late signal for an earlier call
is ignored).  The handler stays installed; it is installed again if a target replaced it.

Outside the main thread (or without ``pthread_kill``) the call runs in a daemon thread that is
abandoned if it hangs.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from typing import Any


class StepTimeout(BaseException):
    """The target did not return within the per-step timeout (BaseException: targets' broad
    ``except Exception`` must not swallow it)."""


class Watchdog:
    """The deadline of the call under way (``current``) and the thread that enforces it."""

    POLL = 0.05  # the longest the watchdog sleeps before looking again (seconds)

    def __init__(self) -> None:
        self.current: tuple[int, float] | None = None  # (call number, deadline) of the call under way
        self.calls = 0
        self.fired: tuple[int, float] | None = None  # the call the last signal was sent for
        self.thread: threading.Thread | None = None
        self.main_ident = threading.main_thread().ident

    def call(self, fn: Any, timeout: float, *args: Any) -> Any:
        """``fn(*args)`` in the main thread, interrupted by ``StepTimeout`` after ``timeout`` seconds."""
        if _raw_getsignal(_SIGALRM) != self.on_alarm:
            signal.signal(signal.SIGALRM, self.on_alarm)
        if self.thread is None:
            self.thread = threading.Thread(target=self.watch, name="kvspec-step-timeout", daemon=True)
            self.thread.start()
        self.calls += 1
        outer, self.current = self.current, (self.calls, time.monotonic() + timeout)
        try:
            return fn(*args)
        finally:
            self.current = outer  # a call inside another: the outer call's deadline again

    def on_alarm(self, signum: int, frame: Any) -> None:
        """In the main thread: the call under way ran past its deadline (a late signal is ignored)."""
        current = self.current
        if current is not None and time.monotonic() >= current[1]:
            self.current = None
            raise StepTimeout()

    def watch(self) -> None:
        """The watchdog: signal the main thread once per call that runs past its deadline."""
        while True:
            current = self.current
            now = time.monotonic()
            if current is None or current is self.fired or now < current[1]:
                wait = self.POLL if current is None else min(self.POLL, max(0.0, current[1] - now))
                time.sleep(max(wait, 0.001))
                continue
            self.fired = current
            assert self.main_ident is not None
            signal.pthread_kill(self.main_ident, signal.SIGALRM)


WATCHDOG = Watchdog()
_SIGALRM = int(signal.SIGALRM)
_raw_getsignal: Any = importlib.import_module("_signal").getsignal  # signal.getsignal's enum wrapping costs 6 µs


def _after_fork_in_child() -> None:
    """A forked worker has no watchdog thread (threads do not survive a fork): start its own."""
    WATCHDOG.thread, WATCHDOG.current, WATCHDOG.fired = None, None, None
    WATCHDOG.main_ident = threading.main_thread().ident


os.register_at_fork(after_in_child=_after_fork_in_child)


def call_with_timeout(fn: Any, timeout: float | None, *args: Any) -> Any:
    """Run ``fn(*args)``; raise ``StepTimeout`` after ``timeout`` seconds (None or 0: no bound)."""
    if not timeout:
        return fn(*args)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill"):
        return WATCHDOG.call(fn, timeout, *args)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise StepTimeout()
    if "error" in box:
        raise box["error"]
    return box["value"]
