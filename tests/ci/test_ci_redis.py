"""Many workers, one database: two fuzz processes share Hypothesis' ``RedisExampleDatabase`` behind a
real ``redis-server`` (loopback, a free port, no persistence: docs/ci.md's recipe), and a failure one finds is replayed
first by the other (which runs the ``replay`` profile: no generation, only the stored examples)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest
from ci_helpers import kvspec
from user_repo import redis_recipe

REDIS = shutil.which("redis-server")
pytestmark = [
    pytest.mark.skipif(
        REDIS is None, reason="redis-server is not installed (docs/ci.md; bash ci/test --with-redis installs it)"
    ),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]
pytest.importorskip("redis", reason="the redis client is not installed (ci/requirements.txt)")


@pytest.fixture
def redis_url(tmp_path):
    """A server started and stopped by docs/ci.md's recipe (``user_repo.redis_recipe``), on a free port."""
    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start, url, stop = redis_recipe()
    env = {**os.environ, "REDIS_PORT": str(port)}

    def sh(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, text=True, capture_output=True, timeout=30)

    started = sh(start)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not start")
        client.close()
        yield sh(f'{url}; echo "$KVSPEC_REDIS_URL"').stdout.strip()
    finally:
        assert sh(stop).returncode == 0


BUG = ("--target", "mutant:hits_not_touched", "--family", "full", "--shrink-seconds", "2")


def test_a_failure_found_by_one_worker_is_replayed_first_by_the_other(redis_url, tmp_path):
    first = kvspec("fuzz", *BUG, "--seconds", "30", "--db", f"{redis_url}/0", "--out", "a", cwd=tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    # The second process generates nothing: it can only fail by replaying what the first stored.
    second = kvspec(
        "fuzz",
        *BUG,
        "--seconds",
        "30",
        "--seed",
        "7",
        "--profile",
        "replay",
        "--db",
        f"{redis_url}/0",
        "--out",
        "b",
        cwd=tmp_path,
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert "FOUND divergence" in second.stdout
    # The control: the same replay on an empty database (another Redis database number) has nothing to
    # replay, and says so (exit 4: it checked nothing), rather than finding something.
    control = kvspec(
        "fuzz", *BUG, "--seconds", "30", "--profile", "replay", "--db", f"{redis_url}/1", "--out", "c", cwd=tmp_path
    )
    assert control.returncode == 4, control.stdout + control.stderr
    assert "holds no example" in control.stdout


def test_an_unreachable_server_is_a_usage_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    r = kvspec("fuzz", "--db", f"redis://127.0.0.1:{port}/0", "--seconds", "1", cwd=tmp_path)
    assert r.returncode == 2 and "cannot reach it" in r.stderr, r.stderr
