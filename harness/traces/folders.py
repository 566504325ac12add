"""Finding the traces below folders, for ``kvspec replay`` (``harness.traces.trace`` reads each file).

A folder is walked for ``*.json`` files, not into hidden folders or virtualenvs; a file that is no
kvspec trace is skipped and listed (with why), a bad trace is an error naming it, and a folder
without any trace is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kvspec.harness.core.strict_json import TraceFormatError
from kvspec.harness.traces.trace import Trace, parse_json, read_bytes, read_trace, trace_from_json

_MARKER = b'"kvspec_trace"'


@dataclass
class TraceSet:
    """The traces ``find_traces`` read, and the ``.json`` files it skipped (with why)."""

    traces: list[tuple[Path, Trace]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def find_traces(paths: list[str]) -> TraceSet:
    """Read the traces named by ``paths``: a file must be a trace; a folder is walked for ``*.json``
    files (not into hidden folders or virtualenvs), those that are not kvspec traces are skipped,
    and it must hold at least one trace.  A bad trace raises ``TraceFormatError`` naming it."""
    found = TraceSet()
    for raw in paths:
        if not raw:
            raise TraceFormatError("an empty path names no trace file or folder (use '.' for this folder)")
        p = Path(raw)
        if p.is_dir():
            _read_folder(p, found)
        else:
            found.traces.append((p, read_trace(p)))
    return found


def _read_folder(root: Path, found: TraceSet) -> None:
    before, skipped = len(found.traces), len(found.skipped)
    for path in _json_files(root):
        trace = _sniff(path)
        if isinstance(trace, str):
            found.skipped.append((path, trace))
        else:
            found.traces.append((path, trace))
    if len(found.traces) == before:
        others = len(found.skipped) - skipped
        raise TraceFormatError(
            f"{root}: folder holds no kvspec traces" + (f" ({others} other .json file(s) skipped)" if others else "")
        )


def _skip_folder(path: Path) -> bool:
    """Hidden folders (``.git``, ``.venv``, ``.hypothesis``, report temporaries) and virtualenvs."""
    return path.name.startswith(".") or (path / "pyvenv.cfg").exists()


def _json_files(root: Path) -> list[Path]:
    """The regular ``*.json`` files below ``root``, sorted, outside the folders ``_skip_folder`` names."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not _skip_folder(here / d))
        out += [here / n for n in filenames if n.lower().endswith(".json") and (here / n).is_file()]
    return sorted(out)


def _head(path: Path, n: int = 4096) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _sniff(path: Path) -> Trace | str:
    """A file found in a folder: its trace, or why it is skipped (it is no kvspec trace).  A file
    that is a trace (a top-level ``kvspec_trace`` field; or, unreadable as JSON, one that mentions
    it) but a bad one raises ``TraceFormatError``."""
    try:
        data = read_bytes(path)
    except TraceFormatError as e:
        if _MARKER in _head(path):
            raise
        return str(e).removeprefix(f"{path}: ")
    try:
        obj = parse_json(data, str(path))
    except TraceFormatError as e:
        if _MARKER in data:
            raise
        return f"not a kvspec trace ({str(e).removeprefix(f'{path}: ')})"
    if type(obj) is not dict or "kvspec_trace" not in obj:
        return "not a kvspec trace (no top-level 'kvspec_trace' field)"
    return trace_from_json(obj, str(path))
