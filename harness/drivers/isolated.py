"""A call made in a child process, so that a target that crashes cannot take kvspec down with it.

``call_isolated(fn, *args)`` forks; the child opens the flight recorder (``harness.core.flight``),
runs ``fn`` and sends back its value (or what it raised) through a pipe.  A child that ends without
sending it (a signal such as SIGSEGV or SIGABRT, ``os._exit``, kvspec's standard streams closed
under it) crashed: the parent gets a ``Crash`` with the flight log, so it knows the example and the
operation the target died in.  The parent passes SIGINT and SIGTERM on, and kills a child still
running ``seconds`` after it started (a target that hangs where no per-step guard reaches).

On top: the ``target-crashed`` finding and its trace (``crash_trace``: the operations up to the
crashing one, with the spec's outcomes), and its reduction, every candidate replayed in its own child
(``reduce_crash``).  Fork is taken before the target is loaded (``harness.run.supervise``) or from a
process that only replays; Linux's parent-death signal ends a child whose parent was killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import pickle
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvspec.harness.check.finding import Finding
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core.flight import FLIGHT, FlightLog, read_flight
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.drivers.base import reduce_finding, signal_name
from kvspec.harness.traces.trace import Trace, config_from_json, config_to_json

if TYPE_CHECKING:
    from kvspec.harness.traces.replay import ReplayResult

CRASHED = "target-crashed"
_PR_SET_PDEATHSIG = 1


@dataclass
class Crash:
    """How a child ended without its result: ``how`` in words, the signal or exit status, its flight log."""

    how: str
    log: FlightLog
    signum: int | None = None
    status: int | None = None
    hung: bool = False


@dataclass
class Isolated:
    """What an isolated call gave: its value, or the ``Crash``."""

    value: Any = None
    crash: Crash | None = None


@dataclass
class _Sent:
    """The child's result, and what it printed to streams that are not the process' own (pytest's capsys)."""

    result: Any
    out: str = ""
    err: str = ""


def _hold_unreal_streams() -> tuple[io.StringIO | None, io.StringIO | None]:
    """``sys.stdout``/``sys.stderr`` replaced by buffers when they are not the process' files (an
    in-memory capture, as under pytest's ``capsys``): the parent prints what they held."""
    held: list[io.StringIO | None] = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.fileno()
            held.append(None)
        except (AttributeError, OSError, ValueError):
            held.append(io.StringIO())
            setattr(sys, name, held[-1])
    return held[0], held[1]


class _Raised:
    """What the child raised, sent back to be raised again in the parent."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def call_isolated(
    fn: Callable[..., Any],
    *args: Any,
    seconds: float | None = None,
    on_signal: Callable[[int], None] | None = None,
) -> Isolated:
    """``fn(*args)`` in a forked child (module docstring); what it raises is raised here again.
    ``on_signal(signum)``: told of each SIGINT or SIGTERM passed on to the child."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    workdir = tempfile.mkdtemp(prefix="kvspec-flight-")
    flight = os.path.join(workdir, "flight")
    fd = os.open(flight, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        _child(fn, args, w, fd)
    os.close(w)
    os.close(fd)
    try:
        data, status, hung = _collect(pid, r, seconds, on_signal)
        return _outcome(data, status, hung, flight)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(flight)
        with contextlib.suppress(OSError):
            os.rmdir(workdir)


def _child(fn: Callable[..., Any], args: tuple[Any, ...], w: int, fd: int) -> None:
    status = 0
    try:
        _die_with_parent()
        FLIGHT.open(fd, config_to_json)
        held = _hold_unreal_streams()
        try:
            result: Any = fn(*args)
        except BaseException as e:  # noqa: BLE001 - sent back, raised again in the parent
            result = _Raised(e)
        FLIGHT.close()
        _send(w, _Sent(result, *(s.getvalue() if s is not None else "" for s in held)))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    except BaseException:  # noqa: BLE001 - the result could not be sent: the parent sees a crash
        status = 70
    os._exit(status)


def _send(w: int, sent: _Sent) -> None:
    try:
        data = pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # a value or an exception that does not pickle: its words
        what = sent.result.error if isinstance(sent.result, _Raised) else sent.result
        words = RuntimeError(f"{type(what).__name__}: {what!r} (cannot be sent back: {e})")
        data = pickle.dumps(_Sent(_Raised(words), sent.out, sent.err))
    view = memoryview(data)
    while view:
        view = view[os.write(w, view) :]
    os.close(w)


def _die_with_parent() -> None:
    """Linux: this child gets SIGKILL when its parent dies (a supervisor killed with ``kill -9``)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _collect(
    pid: int, r: int, seconds: float | None, on_signal: Callable[[int], None] | None
) -> tuple[bytes, int, bool]:
    """The child's bytes and exit status, passing on the signals this process gets (it ignores them
    meanwhile); the child killed once ``seconds`` are up (``hung``)."""
    chunks: list[bytes] = []
    ends = None if seconds is None else time.monotonic() + seconds
    hung = False
    with _passing_signals_to(pid, on_signal):
        while True:
            wait = 0.2 if ends is None else max(0.0, min(0.2, ends - time.monotonic()))
            ready, _, _ = select.select([r], [], [], wait)
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
            elif ends is not None and time.monotonic() >= ends:
                hung = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
        os.close(r)
        _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status, hung


@contextlib.contextmanager
def _passing_signals_to(pid: int, on_signal: Callable[[int], None] | None) -> Any:
    """SIGINT and SIGTERM sent on to ``pid`` (which stops cleanly on the first), not acted on here."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum: int, frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if on_signal is not None:
            on_signal(signum)

    saved = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def _outcome(data: bytes, status: int, hung: bool, flight: str) -> Isolated:
    if not hung and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and data:
        sent = pickle.loads(data)  # noqa: S301 - our own child's bytes, through our own pipe
        sys.stdout.write(sent.out)
        sys.stderr.write(sent.err)
        result = sent.result
        if isinstance(result, _Raised):
            if _streams_closed(result.error):
                return Isolated(crash=Crash("closed kvspec's standard streams", read_flight(flight)))
            raise result.error
        return Isolated(value=result)
    return Isolated(crash=_crash(status, hung, read_flight(flight)))


def _streams_closed(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.EBADF, errno.EPIPE)


def _crash(status: int, hung: bool, log: FlightLog) -> Crash:
    if hung:
        return Crash("did not finish in time and was killed", log, hung=True)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        return Crash(f"was killed by {signal_name(signum)}", log, signum=signum)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return Crash(f"exited with status {code} in the middle of the run (os._exit, exit() or abort)", log, status=code)


# --- the finding -------------------------------------------------------------------------------------


def crash_finding(crash: Crash) -> Finding:
    """The ``target-crashed`` (killed as hung: ``target-hung``) finding of ``crash``: where the target
    was, and how the process ended."""
    log = crash.log
    step = len(log.ops) - 1 if log.ops else None
    op = op_to_json(log.ops[-1]) if log.ops else None
    message = f"the process running the target {crash.how}, {log.where()}"
    return Finding("target-hung" if crash.hung else CRASHED, step, message, op)


def crash_trace(crash: Crash, relation: str, target: str, profile: str | None = None) -> Trace | None:
    """The trace of ``crash``: the example's configuration and its operations up to the one the
    target died in, with the spec's outcomes; None when it died before its first reset."""
    from kvspec.harness.traces.reduce import spec_steps

    log = crash.log
    if log.config is None:
        return None
    config = config_from_json(log.config, "flight record")
    finding = crash_finding(crash).to_json()
    return _flight_trace(log, config, spec_steps(config, log.ops), finding, relation, target, profile)


def _flight_trace(
    log: FlightLog,
    config: Any,
    steps: list[tuple[Any, Any]],
    finding: dict[str, Any],
    relation: str,
    target: str,
    profile: str | None,
) -> Trace:
    """A trace of the run ``log`` recorded: its turn's family and seed, the target's version."""
    return Trace(
        config=config,
        steps=steps,
        target_name=target,
        target_version=str(log.run.get("target_version", "")),
        seed=log.seed,
        profile=profile,
        family=log.family,
        relation=relation,
        finding=finding,
    )


def found_trace(log: FlightLog, relation: str, target: str, profile: str | None = None) -> dict[str, Any] | None:
    """The finding the process made before it died, as trace JSON: the run loop's (``log.found``), else
    the lockstep's smallest so far (``log.found_steps``); None if none."""
    from kvspec.harness.traces.trace import trace_to_json

    if log.found is not None:
        return log.found
    if log.found_steps is None:
        return None
    finding, steps, config = log.found_steps
    config_value = config_from_json(config, "flight record")
    return trace_to_json(_flight_trace(log, config_value, list(steps), finding, relation, target, profile))


def isolated_run_ops(seconds: float) -> Callable[..., tuple[Finding | None, list[tuple[Any, object]]]]:
    """A ``run_ops`` for the reducer (``harness.traces.reduce``) that replays each candidate in its own
    child: a crash is a ``target-crashed`` finding at the operation it died in."""
    from kvspec.harness.traces.reduce import run_ops, spec_steps

    def run(config: Any, ops: list[Any], factory: Callable[[], Any], checks: CheckSettings) -> Any:
        out = call_isolated(run_ops, config, ops, factory, checks, seconds=seconds)
        if out.crash is None:
            return out.value
        if out.crash.log.config is None:
            return crash_finding(out.crash), []
        return crash_finding(out.crash), spec_steps(config, out.crash.log.ops)

    return run


def reduce_crash(trace: Trace, factory: Callable[[], Any], checks: CheckSettings, seconds: float) -> Trace:
    """``trace`` (ending in a crash) made smaller by ``reduce_finding``, each candidate replayed in its
    own child, within ``seconds``; as it was if it does not crash again outside the run."""
    if trace.finding is None:
        return trace
    runner = isolated_run_ops(max(5.0, (checks.step_timeout or 10.0) * 2))
    return reduce_finding(trace, Finding(**trace.finding), factory, checks, seconds, lambda: False, runner=runner)[0]


def replay_isolated(trace: Trace, factory: Callable[[], Any], checks: CheckSettings) -> ReplayResult:
    """``trace`` replayed (``harness.traces.replay``) in a child: a crash there is the replay's
    ``target-crashed`` finding, not the end of this process (a crash's trace replays this way)."""
    from kvspec.harness.traces.replay import ReplayResult, replay

    out = call_isolated(replay, trace, factory, checks, seconds=30.0 + 2 * (checks.step_timeout or 10.0))
    if out.crash is None:
        result: ReplayResult = out.value
        return result
    finding = crash_finding(out.crash)
    return ReplayResult(False, len(out.crash.log.ops), finding.summary(), finding)
