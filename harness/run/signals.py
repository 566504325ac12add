"""SIGINT and SIGTERM during ``kvspec fuzz``: a clean stop at a safe point that keeps what was found.

``SIGNALS`` is installed by the CLI (and in each worker process, ``harness.run.workers``); the fuzzing
loop, the state machine and the reducer poll it.  The run then writes the smallest failing trace
recorded so far and exits ``128 + signal`` (130, 143).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from kvspec.harness.drivers.base import Interrupted, signal_name

__all__ = ["SIGNALS", "Interrupted", "StopSignals", "signal_name"]


class StopSignals:
    """SIGINT and SIGTERM while ``kvspec fuzz`` runs (installed in the main thread only).

    The handler only keeps the first signal in ``signum`` (later ones are ignored, so a second Ctrl-C
    cannot break the writing of the report).  The run stops at safe points: the state machine calls
    ``poll`` before every operation (Hypothesis then stops, generating or shrinking), the reducer and
    the fuzzing loop check ``signum``.  Only inside ``armed()`` (a target loading: an import may take
    long) does the handler raise ``Interrupted`` itself.  Raising from the handler anywhere else could
    land in Hypothesis' own code or in a gc callback, where Python swallows it ("Exception ignored")
    and the run would go on; such a swallowed ``Interrupted`` is not printed (``sys.unraisablehook``)."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._armed = False
        self._saved: dict[int, Any] = {}
        self._saved_hook: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self._armed:
            raise Interrupted(signum)

    def _unraisable(self, info: Any) -> None:
        if not isinstance(info.exc_value, Interrupted):
            (self._saved_hook or sys.__unraisablehook__)(info)

    def note(self, signum: int) -> None:
        """A signal this process learnt of another way (a supervisor passing it on to its child)."""
        if self.signum is None:
            self.signum = signum

    def poll(self) -> None:
        """Raise ``Interrupted`` if a signal came (called where stopping is safe)."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def install(self) -> None:
        """Handle the signals from now on (a worker process does so for its lifetime)."""
        self.signum, self._armed = None, False
        if threading.current_thread() is threading.main_thread() and not self._saved:
            for s in self.HANDLED:
                self._saved[s] = signal.signal(s, self._handle)
            self._saved_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def restore(self) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if self._saved:
            sys.unraisablehook = self._saved_hook
        self._saved.clear()
        self.signum, self._armed = None, False

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        self.install()
        try:
            yield self
        finally:
            self.restore()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Raise ``Interrupted`` at once on a signal inside this block (at entry if one came already)."""
        self.poll()
        was, self._armed = self._armed, True
        try:
            yield
        finally:
            self._armed = was


SIGNALS = StopSignals()
