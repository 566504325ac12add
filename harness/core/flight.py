"""The flight recorder: what a run was doing, written as it happens, for the process that outlives it.

A target runs inside kvspec's own process, so a target that segfaults, aborts or calls ``os._exit``
takes the run with it.  The run is therefore made in a child process (``harness.drivers.isolated``)
whose recorder writes, before each call into the target, what is about to happen: the turn (family
and seed), the start of each example (its configuration), each operation.  The writes go straight
to a file (one ``os.write`` each, nothing buffered in the process), so when the child dies the parent
reads the file and knows the example and the operation the target died in.  A finding made before
the crash is written at once, before it is reduced, so the crash cannot lose it.

Cost: one ``marshal`` of the operation's fields and one ``write`` per operation (about 3 us;
``python -m kvspec.harness.bench.supervision`` measures the run with and without).  Off (one
attribute test per call) unless a supervisor opened it.

The file is the supervisor's own temporary file, read back by ``read_flight``, which builds nothing
but plain values and the operations of ``harness.core.ops`` (marshalled fields, or an unpickler
that refuses any other class).
"""

from __future__ import annotations

import dataclasses
import io
import marshal
import operator
import os
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvspec.harness.core import ops as O

_FRAME = struct.Struct("<I")
_TRUNCATE_AT = 1 << 20  # bytes: at an example's start, a longer file is emptied first


@dataclass
class FlightLog:
    """What a recorder's file says of the last moments of its process: the run's own facts (target,
    relation, ...), the turn under way (family, seed), the last example's configuration (JSON) and the
    operations sent to the target in it, the last one first to suspect; and a finding recorded before
    the end: by the run loop as trace JSON (``found``), or by the lockstep before shrinking went on
    (``found_steps``)."""

    run: dict[str, Any] = field(default_factory=dict)
    family: str | None = None
    seed: int | None = None
    config: dict[str, Any] | None = None
    ops: list[O.Op] = field(default_factory=list)
    found: dict[str, Any] | None = None
    found_steps: tuple[dict[str, Any], list[tuple[O.Op, Any]], dict[str, Any]] | None = None  # finding, steps, config

    def where(self) -> str:
        """Where the target was when the process ended, in words."""
        if self.config is None:
            return "before its first example (loading the target)"
        if not self.ops:
            return "in its factory, reset or first observation, before any operation"
        last = self.ops[-1]
        return f"at operation {len(self.ops) - 1} ({last.op}) or in the checks right after it"


class FlightRecorder:
    """The recorder of this process: off until ``open``; every record is one frame (length, pickle)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.encode_config: Callable[[Any], dict[str, Any]] = lambda c: {}
        self.written = 0
        self.context: dict[str, tuple[Any, ...]] = {}  # the run's and the turn's records (again after emptying)

    def open(self, fd: int, encode_config: Callable[[Any], dict[str, Any]]) -> None:
        self.fd, self.encode_config, self.written = fd, encode_config, 0
        self.context = {}

    def close(self) -> None:
        self.fd = None

    def note_run(self, facts: dict[str, Any]) -> None:
        """The run's own facts (the target's name, the relation in force), once, at its start."""
        self.context["run"] = ("run", facts)
        self._write(self.context["run"])

    def turn(self, family: str, seed: int | None) -> None:
        self.context["turn"] = ("turn", family, seed)
        self._write(self.context["turn"])

    def begin(self, config: Any) -> None:
        """An example starts on ``config`` (before the target's reset)."""
        if self.fd is None:
            return
        if self.written > _TRUNCATE_AT:
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            self.written = 0
            for record in self.context.values():
                self._write(record)
        self._write(("begin", self.encode_config(config)))

    def op(self, op: O.Op) -> None:
        """``op`` is about to be sent to the target (its class name and field values, marshalled: the
        hot path; an operation holding more than plain values is pickled)."""
        if self.fd is None:
            return
        name, values = type(op).__name__, _FIELD_VALUES[type(op)](op)
        try:
            data = marshal.dumps(("op_fields", name, values))
        except ValueError:  # e.g. AddRequest's multimodal features
            self._write(("op", op))
            return
        self.written += os.write(self.fd, _FRAME.pack(len(data)) + b"M" + data)

    def found_steps(self, finding: dict[str, Any], steps: list[tuple[O.Op, Any]], config: Any) -> None:
        """The smallest finding so far, as the lockstep recorded it (outcomes in JSON form), before
        Hypothesis goes on shrinking it: kept in this file (and again after it is emptied)."""
        if self.fd is not None:
            self.context["found"] = ("found", finding, steps, self.encode_config(config))
            self._write(self.context["found"])

    def found(self, trace_json: dict[str, Any]) -> None:
        """A finding, as trace JSON, kept before anything else is tried on the target (and again after
        the file is emptied)."""
        if self.fd is not None:
            self.context["found_trace"] = ("found_trace", trace_json)
            self._write(self.context["found_trace"])

    def _write(self, record: tuple[Any, ...]) -> None:
        if self.fd is None:
            return
        data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        self.written += os.write(self.fd, _FRAME.pack(len(data)) + b"P" + data)


_OP_CLASSES = {t.__name__: t for t in O.OP_TYPES.values()}


def _values_of(t: type) -> Callable[[Any], tuple[Any, ...]]:
    """The field values of an operation of class ``t``, in its constructor's order (C-speed)."""
    names = [f.name for f in dataclasses.fields(t) if f.init]
    if len(names) < 2:
        return lambda op: tuple(getattr(op, n) for n in names)
    return operator.attrgetter(*names)


_FIELD_VALUES = {t: _values_of(t) for t in O.OP_TYPES.values()}


FLIGHT = FlightRecorder()


class _Unpickler(pickle.Unpickler):
    """Builds plain values and the operations of ``harness.core.ops``, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == O.__name__ and name in {t.__name__ for t in (*O.OP_TYPES.values(), O.MMFeatureSpec)}:
            return getattr(O, name)
        raise pickle.UnpicklingError(f"the flight record names {module}.{name}, which it never holds")


def read_flight(path: str) -> FlightLog:
    """The log a recorder left at ``path``; a frame cut short by the end is dropped."""
    log = FlightLog()
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + _FRAME.size + 1 <= len(data):
        (n,) = _FRAME.unpack_from(data, at)
        body = data[at + _FRAME.size + 1 : at + _FRAME.size + 1 + n]
        if len(body) < n:
            break
        _apply(log, _decode(data[at + _FRAME.size : at + _FRAME.size + 1], body))
        at += _FRAME.size + 1 + n
    return log


def _decode(tag: bytes, body: bytes) -> tuple[Any, ...]:
    """One record: ``M`` marshalled plain values (an operation's class name and fields), ``P`` pickled
    under ``_Unpickler``."""
    if tag == b"M":
        kind, name, values = marshal.loads(body)
        if kind != "op_fields" or name not in _OP_CLASSES:
            raise pickle.UnpicklingError(f"the flight record names {name!r}, which it never holds")
        return ("op", _OP_CLASSES[name](*values))
    if tag != b"P":
        raise pickle.UnpicklingError(f"the flight record has an unknown frame tag {tag!r}")
    record: tuple[Any, ...] = _Unpickler(io.BytesIO(body)).load()
    return record


def _apply(log: FlightLog, record: tuple[Any, ...]) -> None:
    kind = record[0]
    if kind == "run":
        log.run.update(record[1])
    elif kind == "turn":
        log.family, log.seed, log.config, log.ops = record[1], record[2], None, []
    elif kind == "begin":
        log.config, log.ops = record[1], []
    elif kind == "op":
        log.ops.append(record[1])
    elif kind == "found_trace":
        log.found = record[1]
    elif kind == "found":
        log.found_steps = (record[1], record[2], record[3])
