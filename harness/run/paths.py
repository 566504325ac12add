"""Paths kvspec writes to, checked before any work: ``probe_writable_folder`` (``--out``, the example
database), its one implementation for ``harness.run.options`` and ``harness.run.profiles``; and
``write_file_atomically``, how a run's result files (JUnit, SARIF) are written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


class NotAFolder(Exception):
    """A path on the way to a folder is a file (``blocker``)."""

    def __init__(self, blocker: Path) -> None:
        super().__init__(f"{blocker} is a file, not a folder")
        self.blocker = blocker


def probe_writable_folder(folder: str) -> None:
    """``folder`` is a folder this process can write in, or can create: it is made (with its missing
    parents), a temp file is written in it and removed, and the folders made for the check are removed
    again (nothing is left behind).  ``NotAFolder`` when a path on the way is a file, ``OSError`` when
    it cannot be made or written in, ``ValueError`` for a path that is none (a NUL in it)."""
    path = Path(folder)
    chain = [path, *path.parents]
    missing = [p for p in chain if not p.exists()]  # deepest first
    blocker = next((p for p in chain if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise NotAFolder(blocker)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvspec-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    finally:
        for p in missing:
            with contextlib.suppress(OSError):
                p.rmdir()


def write_file_atomically(path: Path, data: bytes) -> None:
    """``data`` into ``path``: written to a temp file beside it, then renamed into place, so a reader
    never sees half a file (the temp file is removed if anything fails)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
