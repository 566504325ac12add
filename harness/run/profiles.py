"""Hypothesis profiles for the harness: ``dev`` (quick), ``ci`` (the mutant catch budget), ``nightly``,
and ``replay`` (no generation: only the examples already in the database, i.e. past failures).

All share one example database: ``.hypothesis/examples`` by default, or what ``KVSPEC_DB`` (or the
CLI's ``--db``) names: a folder, or ``redis://host:port/n`` for Hypothesis' ``RedisExampleDatabase``
behind a Redis server that several machines share.  A CI job that caches the folder (or points at
the server) re-tries past failures first.  Deadlines are off: a slow target is caught by the
harness' per-step timeout, not by Hypothesis.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from kvspec.harness.run.paths import NotAFolder, probe_writable_folder

PROFILES: dict[str, dict[str, object]] = {
    "dev": dict(max_examples=30, stateful_step_count=40),
    "ci": dict(max_examples=500, stateful_step_count=50),
    "nightly": dict(max_examples=2000, stateful_step_count=80),
    "replay": dict(max_examples=30, stateful_step_count=50, phases=(Phase.explicit, Phase.reuse)),
}
DEFAULT_DB = ".hypothesis/examples"


def database(spec: str | None = None) -> ExampleDatabase:
    """The example database ``spec`` names (default: ``KVSPEC_DB``, else ``.hypothesis/examples``).

    ``redis://host[:port][/n]`` is a Redis server (port 6379, database 0 by default); anything else
    is a folder.  ``ValueError`` says what is wrong with a malformed URL."""
    return _database(spec or os.environ.get("KVSPEC_DB") or DEFAULT_DB)


class FolderDatabase(DirectoryBasedExampleDatabase):
    """Hypothesis' folder database that opens regular files only: a FIFO, a device or a link placed in
    it (``/dev/zero``) is passed over instead of blocking or filling memory; a file larger than
    ``MAX_EXAMPLE_BYTES`` is passed over too (no example kvspec writes comes near)."""

    MAX_EXAMPLE_BYTES = 1 << 20

    def fetch(self, key: bytes) -> Iterable[bytes]:
        folder = self._key_path(key)
        try:
            entries = list(os.scandir(folder))
        except OSError:  # no such folder (nothing stored yet), or not a folder
            return
        for entry in entries:
            try:
                regular = entry.is_file(follow_symlinks=False)
                if not regular or entry.stat(follow_symlinks=False).st_size > self.MAX_EXAMPLE_BYTES:
                    continue
                with open(entry.path, "rb") as f:
                    yield f.read(self.MAX_EXAMPLE_BYTES + 1)
            except OSError:
                continue


@functools.lru_cache(maxsize=8)
def _database(spec: str) -> ExampleDatabase:
    if "://" not in spec:
        return FolderDatabase(spec)
    url = urlsplit(spec)
    if url.scheme != "redis":
        raise ValueError(
            f"example database {spec!r}: unknown scheme {url.scheme!r} (use a folder or redis://host:port/n)"
        )
    try:
        port = url.port or 6379
    except ValueError:
        raise ValueError(f"example database {spec!r}: the port is not a number in 0..65535") from None
    path = url.path.strip("/") or "0"
    if not url.hostname or not path.isdigit() or url.query or url.fragment:
        raise ValueError(f"example database {spec!r}: expected redis://host:port/n (n: a database number)")
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as e:
        raise ValueError(
            f"example database {spec!r} needs the redis client (install kvspec[redis], or pip install redis;"
            f" ci/setup installs it): {e}"
        ) from None
    client = redis.Redis(host=url.hostname, port=port, db=int(path), password=url.password, socket_connect_timeout=5)
    return RedisExampleDatabase(client)


def check_database(spec: str | None = None) -> ExampleDatabase:
    """``database(spec)``, checked before any work: a folder must be one this process can create and
    write in (not a file, ``/dev/null`` or a read-only folder, where nothing would be kept and nothing
    said); a server must answer one round trip.  ``ValueError`` says what is wrong."""
    db = database(spec)
    if isinstance(db, DirectoryBasedExampleDatabase):
        _check_folder(str(db.path), spec or os.environ.get("KVSPEC_DB") or DEFAULT_DB)
    client = getattr(db, "redis", None)
    if client is not None:
        kw = client.connection_pool.connection_kwargs
        try:
            socket.create_connection((kw["host"], kw["port"]), timeout=5).close()  # refused at once, no client retries
            client.ping()
        except Exception as e:  # redis.ConnectionError, a timeout, an auth error
            raise ValueError(
                f"example database {spec or os.environ.get('KVSPEC_DB')!r}: cannot reach it: {e}"
            ) from None
    return db


def _check_folder(folder: str, shown: str) -> None:
    """``folder`` can hold examples (``harness.run.options.probe_writable_folder``: nothing left behind,
    so a run refused later leaves no folder)."""
    try:
        probe_writable_folder(folder)
    except NotAFolder:
        raise ValueError(f"example database {shown!r}: not a folder (examples would be lost)") from None
    except OSError as e:
        why = e.strerror or e
        raise ValueError(f"example database {shown!r}: cannot write in it ({why}); nothing would be kept") from None


def generates(name: str) -> bool:
    """Whether profile ``name`` generates new examples (``replay`` only re-runs the database's)."""
    phases = PROFILES[name].get("phases")
    return phases is None or Phase.generate in phases  # type: ignore[operator]


def profile_settings(name: str, **overrides: object) -> settings:
    """Settings of profile ``name`` (``ValueError`` for an unknown one), with ``overrides``."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    kw: dict[str, object] = dict(
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        database=database(),
        print_blob=False,
    )
    kw.update(PROFILES[name])
    kw.update(overrides)
    return settings(**kw)  # type: ignore[arg-type]


for _name in PROFILES:
    try:
        settings.register_profile(f"kvspec-{_name}", profile_settings(_name))
    except ValueError:  # a malformed KVSPEC_DB: the CLI (check_database) says so, with exit 2
        break
