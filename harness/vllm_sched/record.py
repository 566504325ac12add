"""Record (or shadow-check) the manager calls of a user's real vLLM process, with no code change.

vLLM 0.33 calls every function registered under the entry-point group ``vllm.general_plugins`` at
start-up (``vllm/plugins/__init__.py``: ``load_general_plugins``); kvspec registers ``register``
there (``pyproject.toml``).  With one of these environment variables set, ``register`` patches
``Scheduler.__init__`` so that every scheduler built afterwards gets the manager proxy of
``harness.vllm_sched.proxy``:

- ``KVSPEC_RECORD=/path/trace.json``: recording only (no spec in the loop).  Every operation and the
  outcome the real manager produced go to a kvspec trace, written atomically every
  ``KVSPEC_RECORD_EVERY`` (1000) operations and at the engine core's shutdown (before its workers are
  torn down: the engine-core process is SIGTERMed, at-exit handlers never run there) or at exit; a
  second scheduler in the same process recording to the same path writes ``trace-2.json`` and so on.
  ``kvspec replay /path/trace.json --target spec`` (or ``vllm``) checks it offline.  A trace holds at
  most ``harness.traces.trace.MAX_STEPS`` operations and ``MAX_BLOCK_STEPS`` block-steps; recording
  stops there (said once on the log), the file keeps the prefix.
- ``KVSPEC_SHADOW=1`` (or ``raise``): the spec in lockstep online; the first divergence, invariant
  or ledger finding writes a report under ``KVSPEC_SHADOW_OUT`` (default ``kvspec-shadow-reports``)
  and raises ``FindingError`` in the scheduler.  ``KVSPEC_SHADOW=log``: the report is written and
  logged, and the shadow stops checking that scheduler (serving goes on).

A scheduler whose config kvspec does not model (other group kinds, another hash, events, sparse
retention of sliding-window blocks, ...) is left alone, with one warning naming the reason.  Inside
the engine the proxy is tolerant (``ManagerProxy``): a call it cannot follow, or a full trace, stops
mirroring with one warning and the engine serves on; every call reaches the real manager with the
scheduler's own arguments.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from kvspec.harness.check.finding import FindingError
from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.traces.trace import MAX_BLOCK_STEPS, MAX_STEPS, Trace, trace_to_json
from kvspec.harness.vllm_sched.proxy import install
from kvspec.harness.vllm_sched.sink import LockstepSink
from kvspec.spec.config import AttentionSpec, KVCacheConfig, chunked_local, full_attention, sliding_window
from kvspec.spec.releases.profile import Profile
from kvspec.spec.types import BlockCount, TokenCount

ENV_RECORD = "KVSPEC_RECORD"
ENV_RECORD_EVERY = "KVSPEC_RECORD_EVERY"
ENV_SHADOW = "KVSPEC_SHADOW"
ENV_SHADOW_OUT = "KVSPEC_SHADOW_OUT"
log = logging.getLogger("kvspec.record")
_STEPS = "<kvspec: the steps>"  # placeholder spliced over by RecordSink.write
_lock = threading.Lock()
_uses: dict[str, int] = {}  # trace path -> schedulers recorded to it in this process


def spec_config_of(scheduler: Any) -> KVCacheConfig:
    """The kvspec config of a real scheduler's manager; ``Unsupported`` names what kvspec lacks."""
    groups: list[AttentionSpec] = []
    for g in scheduler.kv_cache_config.kv_cache_groups:
        s = g.kv_cache_spec
        kind = type(s).__name__
        if kind == "FullAttentionSpec":
            groups.append(full_attention(s.block_size))
        elif kind == "SlidingWindowSpec":
            groups.append(sliding_window(s.block_size, s.sliding_window))
        elif kind == "ChunkedLocalAttentionSpec":
            groups.append(chunked_local(s.block_size, s.attention_chunk_size))
        else:
            raise Unsupported(f"KV-cache group kind {kind} is not modelled by kvspec")
    cache = scheduler.cache_config
    if getattr(cache, "prefix_caching_hash_algo", "sha256") != "sha256":
        raise Unsupported(f"prefix_caching_hash_algo {cache.prefix_caching_hash_algo!r} is not recorded (sha256 only)")
    if scheduler.enable_kv_cache_events:
        raise Unsupported("KV-cache events are not recorded")
    mgr = scheduler.kv_cache_manager
    for attr in ("use_eagle",):
        if getattr(mgr, attr, False):
            raise Unsupported(f"a manager with {attr} is not modelled by kvspec")
    config = KVCacheConfig(
        BlockCount(scheduler.kv_cache_config.num_blocks),
        tuple(groups),
        TokenCount(scheduler.max_model_len),
        enable_caching=bool(cache.enable_prefix_caching),
        watermark=float(scheduler.scheduler_config.watermark or 0.0),
        max_in_flight_tokens=TokenCount(int(scheduler.vllm_config.max_in_flight_tokens)),
    )
    if int(scheduler.hash_block_size) != int(config.hash_block_size):
        config = KVCacheConfig(
            config.num_blocks,
            config.groups,
            config.max_model_len,
            enable_caching=config.enable_caching,
            watermark=config.watermark,
            max_in_flight_tokens=config.max_in_flight_tokens,
            hash_block_size_override=TokenCount(int(scheduler.hash_block_size)),
        )
    if int(scheduler.block_size) != int(config.scheduler_block_size):
        raise Unsupported(f"scheduler block size {scheduler.block_size} is not the LCM of the group block sizes")
    _check_retention(scheduler.kv_cache_config, groups)
    return dataclasses.replace(config, profile=running_profile()).validate()


def running_profile() -> Profile:
    """The profile of the vLLM release this process runs (or of the one ``KVSPEC_VLLM_PROFILE`` names
    for an unknown release): what a recorded trace is stamped with and the spec follows."""
    from kvspec.harness.targets.vllm import _vllm
    from kvspec.harness.targets.vllm_release import ASSUME_ENV

    try:
        return _vllm(os.environ.get(ASSUME_ENV) or None).api.profile  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - an unknown release, or a broken probe: not modelled
        raise Unsupported(f"the running vLLM release is not one kvspec models: {e}") from None


def _check_retention(kv_cache_config: Any, groups: list[AttentionSpec]) -> None:
    """vLLM's ``prefix_cache_retention_interval`` (0.32 on; the engine's default is 0): kvspec models
    dense retention (None), and any value for a config without sliding-window groups (where vLLM
    ignores it: ``kv_cache_coordinator._validate_prefix_cache_retention_interval``).  Sparse retention
    of sliding-window groups (0, or an interval) caches only some of their blocks: not modelled yet,
    so refused with the engine argument that turns it off."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None or not any(g.kind == "sliding_window" for g in groups):
        return
    raise Unsupported(
        f"prefix_cache_retention_interval={interval} (sparse retention of sliding-window blocks, the default "
        "of vLLM's engine since 0.32) is not modelled by kvspec; start the engine with "
        "prefix_cache_retention_interval=None (dense retention) to check it"
    )


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class RecordSink:
    """Operations and the real outcomes, as a kvspec trace at ``path`` (no spec in the loop)."""

    def __init__(self, config: KVCacheConfig, path: Path, every: int = 1000) -> None:
        from kvspec.harness.targets.vllm import vllm_version

        self.config, self.path, self.every = config, path, max(1, every)
        self.version = vllm_version()
        self.steps: list[tuple[O.Op, Any]] = []
        self.limit = min(MAX_STEPS, MAX_BLOCK_STEPS // max(1, int(config.num_blocks)))
        self.full = False
        self.written = 0
        self._lines: list[str] = []  # each step's JSON, serialised once

    @property
    def done(self) -> bool:
        return self.full

    def request_op(self, op: O.Op, request: Any) -> None:
        self._add(op, None)

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        if error is not None:  # the real manager raised: the trace ends here (replay shows the same)
            self._add(op, None)
            self.full = True
            self.write()
            return
        self._add(op, outcome)

    def _add(self, op: O.Op, outcome: Any) -> None:
        if self.full:
            return
        if len(self.steps) >= self.limit:
            self.full = True
            log.warning(
                "kvspec: trace %s is full (%d operations on %d blocks: a trace holds at most %d operations and "
                "%d block-steps); recording stops, serving goes on",
                self.path,
                len(self.steps),
                int(self.config.num_blocks),
                MAX_STEPS,
                MAX_BLOCK_STEPS,
            )
            self.write()
            return
        self.steps.append((op, outcome))
        self._lines.append(json.dumps({**op_to_json(op), "outcome": outcome}))
        if len(self.steps) % self.every == 0:
            self.write()

    def trace(self) -> Trace:
        return Trace(
            config=self.config,
            steps=list(self.steps),
            target_name="vllm",
            target_version=self.version,
            extra={"recorded_by": ENV_RECORD},
        )

    def write(self) -> None:
        if self.written == len(self.steps) and self.path.exists():
            return
        # The trace's JSON (harness/traces/trace.py's schema) with the steps spliced in as serialised once:
        # a periodic write costs one join, not a re-serialisation of every step.
        head = trace_to_json(dataclasses.replace(self.trace(), steps=[]))
        head["steps"] = _STEPS
        text = json.dumps(head).replace(json.dumps(_STEPS), "[\n" + ",\n".join(self._lines) + "\n]", 1)
        _write_atomic(self.path, text + "\n")
        self.written = len(self.steps)
        if self.full or not self.every or self.written % self.every:
            log.info("kvspec: trace %s written (%d operations)", self.path, self.written)


class ShadowSink(LockstepSink):
    """``LockstepSink`` that writes a report at the first finding, then raises or (``log``) stops."""

    def __init__(self, config: KVCacheConfig, manager: Any, out: str, mode: str) -> None:
        from kvspec.harness.targets.vllm_release import ASSUME_ENV

        super().__init__(config, manager, assume_release=os.environ.get(ASSUME_ENV) or None)
        self.config, self.out, self.mode = config, out, mode
        self.report: Path | None = None

    @property
    def done(self) -> bool:
        return self.report is not None

    def request_op(self, op: O.Op, request: Any) -> None:
        if self.report is None:
            self._guard(super().request_op, op, request)

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        if self.report is None:
            self._guard(super().manager_op, op, outcome, error)

    def finish(self) -> None:
        """At exit: the end-of-run full check (large pools glimpse between full checks); a finding
        is written and logged, never raised while the process exits."""
        if self.report is None:
            self._guard(super().finish, at_exit=True)
        if self.report is None:
            log.warning("kvspec shadow: %d operations checked against the spec, no finding", len(self.steps))

    def _guard(self, fn: Any, *args: Any, at_exit: bool = False) -> None:
        try:
            fn(*args)
        except FindingError as e:
            from kvspec.harness.targets.vllm import vllm_version
            from kvspec.harness.traces.report import write_report

            trace = Trace(
                config=self.config,
                steps=list(self.steps),
                target_name="vllm",
                target_version=vllm_version(),
                finding=e.finding.to_json(),
                extra={"recorded_by": ENV_SHADOW},
            )
            self.report = write_report(self.out, trace)
            log.error("kvspec shadow: %s; report written to %s", e.finding.summary(), self.report)
            if self.mode != "log" and not at_exit:
                raise


def _numbered(path: Path, n: int) -> Path:
    return path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")


def attach(scheduler: Any) -> Any:
    """Give ``scheduler`` a recording or shadow proxy, as the environment asks (None: neither, or a
    config kvspec does not model, which is logged)."""
    record, shadow = os.environ.get(ENV_RECORD), os.environ.get(ENV_SHADOW, "")
    if not record and shadow.lower() in ("", "0", "false", "no"):
        return None
    try:
        config = spec_config_of(scheduler)
    except Unsupported as e:
        log.warning("kvspec: not recording this scheduler: %s", e)
        return None
    if record:
        with _lock:
            n = _uses[record] = _uses.get(record, 0) + 1
        try:
            every = int(os.environ.get(ENV_RECORD_EVERY, "1000"))
        except ValueError:
            log.warning("kvspec: %s is not an int; writing every 1000 operations", ENV_RECORD_EVERY)
            every = 1000
        sink: Any = RecordSink(config, _numbered(Path(record), n), every)
        try:
            sink.write()  # an empty trace at once: a bad path shows now, not at exit
        except OSError as e:
            log.warning("kvspec: not recording this scheduler: cannot write %s: %s", sink.path, e)
            return None
        close = sink.write
        log.warning("kvspec: recording this scheduler's manager calls to %s (%s)", sink.path, _described(config))
    else:
        out = os.environ.get(ENV_SHADOW_OUT) or "kvspec-shadow-reports"
        try:
            sink = ShadowSink(config, scheduler.kv_cache_manager, out, "log" if shadow.lower() == "log" else "raise")
        except Unsupported as e:
            log.warning("kvspec: not shadowing this scheduler: %s", e)
            return None
        close = sink.finish
        log.warning("kvspec shadow: the spec checks this scheduler's manager (%s)", _described(config))
    # Written (or finally checked) at the scheduler's shutdown, which the engine core runs on
    # SIGTERM in multi-process mode where at-exit handlers never run; and at exit otherwise.
    scheduler._kvspec_close = _once(close)
    atexit.register(scheduler._kvspec_close)
    return install(scheduler, sink, tolerant=True)


def _described(config: KVCacheConfig) -> str:
    groups = ", ".join(f"{g.kind}(bs={g.block_size})" for g in config.groups)
    return f"{config.num_blocks} blocks, {groups}, profile {config.profile.name}"


def _once(fn: Any) -> Any:
    """``fn`` run at most once, its failure logged (it runs while an engine shuts down)."""
    done = threading.Event()

    def run() -> None:
        if done.is_set():
            return
        done.set()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - never break the engine's shutdown
            log.warning("kvspec: %s at shutdown failed: %s: %s", getattr(fn, "__name__", fn), type(e).__name__, e)

    return run


def close_at_shutdown(scheduler: Any) -> None:
    """The scheduler's trace written (or its shadow's last check run) now, once."""
    close = getattr(scheduler, "_kvspec_close", None)
    if close is not None:
        close()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch ``Scheduler.__init__`` once per process when
    ``KVSPEC_RECORD`` or ``KVSPEC_SHADOW`` is set (nothing otherwise)."""
    if not os.environ.get(ENV_RECORD) and os.environ.get(ENV_SHADOW, "").lower() in ("", "0", "false", "no"):
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler.__init__, "_kvspec_patched", False):
        return
    orig = Scheduler.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        attach(self)

    __init__._kvspec_patched = True  # type: ignore[attr-defined]
    __init__._kvspec_orig = orig  # type: ignore[attr-defined]
    Scheduler.__init__ = __init__  # type: ignore[method-assign]
    orig_shutdown = Scheduler.shutdown

    def shutdown(self: Any) -> None:
        close_at_shutdown(self)
        orig_shutdown(self)

    shutdown._kvspec_orig = orig_shutdown  # type: ignore[attr-defined]
    Scheduler.shutdown = shutdown  # type: ignore[method-assign]
    # The engine core tears its workers down before it shuts the scheduler down (and may be killed
    # while it waits for them): write first.
    from vllm.v1.engine.core import EngineCore

    orig_core_shutdown: Any = EngineCore.shutdown

    def core_shutdown(self: Any) -> None:
        if getattr(self, "scheduler", None) is not None:
            close_at_shutdown(self.scheduler)
        orig_core_shutdown(self)

    core_shutdown._kvspec_orig = orig_core_shutdown  # type: ignore[attr-defined]
    EngineCore.shutdown = core_shutdown  # type: ignore[method-assign]


def unregister() -> None:
    """Undo ``register`` (tests)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    orig = getattr(Scheduler.__init__, "_kvspec_orig", None)
    if orig is not None:
        Scheduler.__init__ = orig  # type: ignore[method-assign]
    orig_shutdown = getattr(Scheduler.shutdown, "_kvspec_orig", None)
    if orig_shutdown is not None:
        Scheduler.shutdown = orig_shutdown  # type: ignore[method-assign]
    from vllm.v1.engine.core import EngineCore

    orig_core_shutdown = getattr(EngineCore.shutdown, "_kvspec_orig", None)
    if orig_core_shutdown is not None:
        EngineCore.shutdown = orig_core_shutdown  # type: ignore[method-assign]
