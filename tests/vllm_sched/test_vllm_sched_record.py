"""Record and shadow modes (harness/vllm_sched/record.py), set up the way a user's vLLM process does
it: the environment variable, then vLLM's own plugin loader calling kvspec's declared
``vllm.general_plugins`` entry point, then a scheduler built as vLLM builds it."""

from __future__ import annotations

import importlib.metadata
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")
tomllib = pytest.importorskip("tomllib")

from kvspec.harness.check.finding import FindingError  # noqa: E402
from kvspec.harness.vllm_sched import record  # noqa: E402
from kvspec.harness.vllm_sched.build import build_scheduler  # noqa: E402
from kvspec.harness.vllm_sched.driver import Driver, draw_config, draw_knobs  # noqa: E402
from kvspec.harness.world.workload import SeededChoices  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
GROUP = "vllm.general_plugins"


def _declared_entry_points() -> list[importlib.metadata.EntryPoint]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][GROUP]
    return [importlib.metadata.EntryPoint(name, value, GROUP) for name, value in declared.items()]


@pytest.fixture
def vllm_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's plugin loader seeing kvspec's entry point as pyproject.toml declares it (whether or not
    this checkout's install metadata is up to date); the Scheduler is put back afterwards."""
    import vllm.plugins

    real = importlib.metadata.entry_points

    def entry_points(**kwargs: str) -> object:
        if kwargs.get("group") == GROUP:
            return _declared_entry_points()
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    yield
    record.unregister()


def _serve(steps: int = 80, family: str = "full", seed: int = 3) -> object:
    """What a user's engine does: load plugins, build the scheduler, run it."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    ch = SeededChoices(random.Random(seed))
    config = draw_config(ch, family)
    knobs = draw_knobs(ch, config, family)
    sched, spec_config = build_scheduler(config, knobs)
    driver = Driver(sched, spec_config, knobs, ch)
    for _ in range(steps):
        driver.step()
    return sched


def test_entry_point_declared() -> None:
    (ep,) = _declared_entry_points()
    assert ep.load() is record.register


def test_record_then_replay_ok(vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvspec.harness.cli import main

    path = tmp_path / "trace.json"
    monkeypatch.setenv(record.ENV_RECORD, str(path))
    monkeypatch.setenv(record.ENV_RECORD_EVERY, "100")
    sched = _serve()
    proxy = sched.kv_cache_manager  # type: ignore[attr-defined]
    assert isinstance(proxy.sink, record.RecordSink)
    assert path.is_file()  # written every 100 operations already
    proxy.sink.write()  # what atexit does
    assert proxy.calls > 50 and len(proxy.sink.steps) > 100
    assert main(["replay", str(path), "--target", "spec"]) == 0
    assert main(["replay", str(path), "--target", "vllm"]) == 0


def test_record_with_manager_bug_replays_exit_1(
    vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvspec.harness.cli import main
    from kvspec.harness.mutants import vllm as mutants_vllm

    path = tmp_path / "trace.json"
    monkeypatch.setenv(record.ENV_RECORD, str(path))
    with mutants_vllm.patched("vllm_free_order_appended"):
        sched = _serve()
    sched.kv_cache_manager.sink.write()  # type: ignore[attr-defined]
    assert main(["replay", str(path), "--target", "spec"]) == 1


def test_no_env_no_proxy(vllm_plugins: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(record.ENV_RECORD, raising=False)
    monkeypatch.delenv(record.ENV_SHADOW, raising=False)
    sched = _serve(steps=5)
    assert type(sched.kv_cache_manager).__name__ == "KVCacheManager"  # type: ignore[attr-defined]


def test_shadow_clean_scheduler_no_report(vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(record.ENV_SHADOW, "1")
    monkeypatch.setenv(record.ENV_SHADOW_OUT, str(tmp_path))
    sched = _serve()
    assert sched.kv_cache_manager.sink.report is None  # type: ignore[attr-defined]
    assert not list(tmp_path.iterdir())


def test_shadow_raises_at_manager_bug(vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvspec.harness.mutants import vllm as mutants_vllm

    monkeypatch.setenv(record.ENV_SHADOW, "1")
    monkeypatch.setenv(record.ENV_SHADOW_OUT, str(tmp_path))
    with mutants_vllm.patched("vllm_free_order_appended"), pytest.raises(FindingError):
        _serve()
    (report,) = tmp_path.iterdir()
    assert (report / "trace.json").is_file()


def test_shadow_log_mode_keeps_serving(vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvspec.harness.mutants import vllm as mutants_vllm

    monkeypatch.setenv(record.ENV_SHADOW, "log")
    monkeypatch.setenv(record.ENV_SHADOW_OUT, str(tmp_path))
    with mutants_vllm.patched("vllm_free_order_appended"):
        sched = _serve(steps=120)
    assert sched.kv_cache_manager.sink.report is not None  # type: ignore[attr-defined]
    assert len(list(tmp_path.iterdir())) == 1


def test_record_sink_stops_when_full(tmp_path: Path) -> None:
    from kvspec.harness.core import ops as O
    from kvspec.harness.traces.trace import read_trace
    from kvspec.spec.config import KVCacheConfig, full_attention

    config = KVCacheConfig(8, (full_attention(4),), 64).validate()
    sink = record.RecordSink(config, tmp_path / "t.json", every=7)
    sink.limit = 20
    sink.request_op(O.AddRequest("r0", (1, 2, 3)), None)
    for n in range(1, 30):
        sink.request_op(O.SetNumComputedTokens("r0", n), None)
    assert sink.done and len(sink.steps) == 20
    assert len(read_trace(tmp_path / "t.json").steps) == 20


def test_unwritable_record_path_leaves_scheduler_alone(
    vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(record.ENV_RECORD, str(blocker / "trace.json"))  # a file as a folder
    sched = _serve(steps=5)
    assert type(sched.kv_cache_manager).__name__ == "KVCacheManager"  # type: ignore[attr-defined]


@pytest.mark.full  # about 8 s: a fresh interpreter imports vLLM and builds a scheduler
def test_installed_entry_point_is_found_by_vllm(tmp_path: Path) -> None:
    """A fresh process whose installed metadata carries pyproject.toml's entry point (as
    ``pip install`` writes it): vLLM's own discovery finds it, and ``KVSPEC_RECORD`` alone makes a
    scheduler built afterwards record."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    dist = site / "kvspec_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvspec-probe\nVersion: 0.0\n")
    lines = "".join(f"{ep.name} = {ep.value}\n" for ep in _declared_entry_points())
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
    trace = tmp_path / "trace.json"
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
        "from kvspec.harness.vllm_sched.build import SchedKnobs, build_scheduler\n"
        "from kvspec.spec.config import KVCacheConfig, full_attention\n"
        "s, _ = build_scheduler(KVCacheConfig(8, (full_attention(4),), 64).validate(), SchedKnobs())\n"
        "print(type(s.kv_cache_manager).__name__)\n"
    )
    env = {**os.environ, record.ENV_RECORD: str(trace), "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "ManagerProxy"
    assert trace.is_file()


def test_shadow_checks_a_large_pool_in_full_at_exit(
    vllm_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large pool is glimpsed between full checks (harness.core.glimpse); the check the sink runs at
    exit compares whole states, so a change no manager call made is still reported."""
    from vllm.plugins import load_general_plugins

    from kvspec.spec.config import KVCacheConfig
    from kvspec.spec.types import BlockCount

    monkeypatch.setenv(record.ENV_SHADOW, "1")
    monkeypatch.setenv(record.ENV_SHADOW_OUT, str(tmp_path))
    load_general_plugins()
    ch = SeededChoices(random.Random(3))
    small = draw_config(ch, "full")
    config = KVCacheConfig(BlockCount(2048), small.groups, small.max_model_len).validate()
    knobs = draw_knobs(ch, config, "full")
    sched, spec_config = build_scheduler(config, knobs)
    driver = Driver(sched, spec_config, knobs, ch)
    for _ in range(40):
        driver.step()
    sink = sched.kv_cache_manager.sink  # type: ignore[attr-defined]
    assert sink.lockstep.incremental and sink.report is None
    sched.kv_cache_manager.block_pool.blocks[1024].ref_cnt += 1  # type: ignore[attr-defined]
    sink.finish()  # what the atexit hook runs: logs and writes, never raises at exit
    assert sink.report is not None
    (report,) = tmp_path.iterdir()
    assert (report / "trace.json").is_file()
