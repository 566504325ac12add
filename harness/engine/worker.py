"""The engine worker: real vLLM engines on the tiny models, every check on, driven over a pipe.

Runs in the engine venv (``python -m kvspec.harness.engine.worker``), started by the driver
(``driver.py``).  It reads one JSON command a line on stdin and answers one JSON line on the
original stdout (vLLM's own prints go to stderr):

- ``{"run": WORKLOAD, "kinds": [...]}``: the workload (``workload.py``'s JSON) on each model kind,
  on an engine with the prefix cache on and one with it off; the answer holds the figures and the
  first finding, if any;
- ``{"record": WORKLOAD, "kind": K, "path": P}``: the same run on a fresh engine with the
  ``KVSPEC_RECORD`` plugin path recording its manager calls to ``P``.

Each engine is built once and held for the worker's life (an engine whose run ended in a finding is
set aside and a fresh one built: its state is no longer trusted; engines are never torn down while
the process lives, as tearing one down takes the process-wide distributed state with it).
``--mutant NAME`` patches a deliberate engine-path bug (``harness.mutants.vllm_engine``) in for the
worker's life.

Checks after every engine step (``EngineUnderCheck.after_step``):
- **shadow**: the spec in lockstep behind the engine's manager (``harness.vllm_sched.sink``): each
  manager call as it happens, the whole state at the step's end (exact relation, invariants, ledger),
  with the world's facts from the engine itself (``EngineUnderCheck._world``: requests sent and
  aborted, tokens the model runner sampled, requests reported finished) in the ledger and
  conservation (``harness.vllm_sched.world_checks``);
- **tables**: each running request's block table in the model runner equals its manager table over
  the blocks it attends to (a sliding-window group's older entries are stale in the runner by design);
- **KV tensors**: K and V at every position a running request attends to, read from the paged cache
  through the runner's table, equal the dense float64 recomputation within ``KV_TOLERANCE``;
- **poison**: every free, uncached block is filled with ``kv_oracle.POISON``, so that a read of it shows.
At each request's end, **outputs**: greedy tokens are the dense model's argmax at every position
(teacher-forced, a near-tie within ``LOGIT_TOLERANCE`` allowed), prompt logprobs equal the dense
log-softmax, and the prefix-cache-on and -off engines agree except at such near-ties.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kvspec.harness.engine.drive import drive, make_llm
from kvspec.harness.engine.models import BLOCK_SIZE, MODEL_KINDS, SLIDING_WINDOW, TINY, write_model
from kvspec.harness.engine.outputs import Counts, EngineFinding, check_outputs
from kvspec.harness.engine.workload import EngineWorkload

KV_TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}
"""Largest |cache - dense| allowed per K/V element (measured here: at most 2.4e-6 in float32)."""
POOL_BLOCKS = 16
"""Blocks per KV-cache group in each engine's pool: small, so that the workloads preempt."""


def pool_bytes(dtype: str) -> int:
    """KV-cache memory for ``POOL_BLOCKS`` blocks of every layer (a hybrid model's two one-layer groups
    then share ``2 * POOL_BLOCKS`` blocks of half the size)."""
    per_element = 4 if dtype == "float32" else 2
    per_block: int = 2 * TINY["num_key_value_heads"] * TINY["head_dim"] * BLOCK_SIZE * per_element
    return POOL_BLOCKS * per_block * int(TINY["num_hidden_layers"])


def _layer_index(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    assert m, f"cannot tell the layer of {name!r}"
    return int(m.group(1))


class EngineUnderCheck:
    """One ``LLM`` on model ``kind`` (prefix cache ``caching``), with the checks hooked in."""

    def __init__(self, kind: str, caching: bool, folder: Path, dense: Any, dtype: str, counts: Counts) -> None:
        from kvspec.harness.vllm_sched.proxy import install
        from kvspec.harness.vllm_sched.record import spec_config_of
        from kvspec.harness.vllm_sched.sink import LockstepSink

        self.kind, self.caching, self.dense, self.dtype, self.counts = kind, caching, dense, dtype, counts
        self.llm = make_llm(folder, pool_bytes(dtype), caching, dtype)
        core: Any = self.llm.llm_engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.runner = core.model_executor.driver_worker.worker.model_runner
        self.config = spec_config_of(self.scheduler)
        self.sink = LockstepSink(self.config, self.scheduler.kv_cache_manager)
        self.proxy = install(self.scheduler, self.sink)
        self.manager = self.proxy._real
        self.groups = self._groups()
        self.steps = 0
        self.world = self._world(core)
        step_fn = core.step_fn

        def step_and_check() -> Any:
            out = step_fn()
            self.after_step()
            return out

        core.step_fn = step_and_check

    def _world(self, core: Any) -> Any:
        """The world's facts from the engine itself (``harness.vllm_sched.world_checks``): which
        requests it was sent and which were aborted (the engine core's own calls), what the model
        runner sampled (its output, before the scheduler appends it) and what the engine reports
        finished; the ledger checks every appended token against the samples, and conservation runs
        at each step's end."""
        from kvspec.harness.vllm_sched.world_checks import WorldChecks

        world = WorldChecks(self.sink)
        add, abort, update = core.add_request, core.abort_requests, self.scheduler.update_from_output

        def add_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            world.arrived(request.request_id)
            return add(request, *args, **kwargs)

        def abort_requests(request_ids: Any, *args: Any, **kwargs: Any) -> Any:
            for rid in request_ids:
                world.aborted(rid)
            return abort(request_ids, *args, **kwargs)

        def update_from_output(scheduler_output: Any, runner_output: Any) -> Any:
            samples = getattr(runner_output, "sampled_token_ids", None) or []
            world.sampled({rid: tuple(t) for rid, t in zip(runner_output.req_ids, samples, strict=False) if len(t)})
            out = update(scheduler_output, runner_output)
            world.engine_outputs(out)
            return out

        core.add_request, core.abort_requests = add_request, abort_requests
        self.scheduler.update_from_output = update_from_output
        return world

    def _groups(self) -> list[tuple[str, list[tuple[int, Any, Any]]]]:
        """Per KV group: its kind and its layers as (layer index, cache tensor, learned layout)."""
        from kvspec.harness.engine.kv_oracle import learn_layout

        ctx = self.runner.compilation_config.static_forward_context
        out = []
        for g in self.scheduler.kv_cache_config.kv_cache_groups:
            spec = g.kv_cache_spec
            kind = "sliding" if type(spec).__name__ == "SlidingWindowSpec" else "full"
            layers = []
            for name in g.layer_names:
                layer = ctx[name]
                cache = layer.kv_cache[0] if isinstance(layer.kv_cache, list) else layer.kv_cache
                layout = learn_layout(layer, cache, spec.block_size, spec.num_kv_heads, spec.head_size)
                layers.append((_layer_index(name), cache, layout))
            out.append((kind, layers))
        return out

    # --- after each engine step ------------------------------------------------------------------

    def after_step(self) -> None:
        self.steps += 1
        self.world.end_of_step()  # the whole state compared, then conservation (raises FindingError)
        self.counts.add(engine_steps=1)
        batch = self.runner.input_batch
        for request in list(self.scheduler.running):
            rid = request.request_id
            row = batch.req_id_to_index.get(rid)
            if row is None or request.num_computed_tokens == 0:
                continue
            tables = self.manager.get_block_ids(rid)
            for gid, (kind, layers) in enumerate(self.groups):
                runner_table = self._runner_table(gid, row)
                first = self._first_needed(kind, request.num_computed_tokens)
                self.check_table(rid, gid, runner_table, list(tables[gid]), first)
                self.check_kv(request, gid, kind, layers, runner_table, first)
        self.poison_free_blocks()

    def _runner_table(self, gid: int, row: int) -> list[int]:
        bt = self.runner.input_batch.block_table.block_tables[gid]
        return [int(b) for b in bt.get_numpy_array()[row, : bt.num_blocks_per_row[row]]]

    @staticmethod
    def _first_needed(kind: str, computed: int) -> int:
        """The first position the request's next token attends to in a group of ``kind``."""
        return max(0, computed - SLIDING_WINDOW + 1) if kind == "sliding" else 0

    def check_table(self, rid: str, gid: int, runner: list[int], manager: list[int], first: int) -> None:
        self.counts.add(tables=1)
        lo = first // BLOCK_SIZE
        if len(runner) != len(manager) or runner[lo:] != manager[lo:]:
            raise EngineFinding(
                "tables",
                f"request {rid}, group {gid}: the model runner's block table differs from the manager's "
                f"from block {lo} on (runner {runner[lo:]}, manager {manager[lo:]})",
                {"request": rid, "group": gid, "runner": runner, "manager": manager, "first_block": lo},
            )

    def check_kv(self, request: Any, gid: int, kind: str, layers: Any, table: list[int], first: int) -> None:
        from kvspec.harness.engine.kv_oracle import read_kv

        computed = request.num_computed_tokens
        tokens = tuple(request.all_token_ids[:computed])
        dense = self.dense.run(tokens)
        positions = range(first, computed)
        tol = KV_TOLERANCE[self.dtype]
        for layer, cache, layout in layers:
            k, v = read_kv(cache, layout, table, positions, BLOCK_SIZE)
            for what, got, want in (
                ("K", k, dense.keys[layer][first:computed]),
                ("V", v, dense.values[layer][first:computed]),
            ):
                err = (got - want).abs().nan_to_num(float("inf"))
                worst = float(err.max())
                self.counts.add(kv_elements=err.numel())
                if worst > tol:
                    p = first + int(err.reshape(len(positions), -1).max(dim=1).values.argmax())
                    block = table[p // BLOCK_SIZE]
                    raise EngineFinding(
                        "kv",
                        f"request {request.request_id}: {what} of layer {layer} at position {p} (block {block}, "
                        f"slot {p % BLOCK_SIZE}) differs from the dense recomputation by {worst:.3g} "
                        f"(tolerance {tol:g}{'; it holds the poison of a free block' if _poisoned(got) else ''})",
                        {
                            "request": request.request_id,
                            "group": gid,
                            "layer": layer,
                            "position": p,
                            "block": block,
                            "error": worst if worst != float("inf") else "nan",
                            "table": table,
                        },
                    )
        self.counts.add(kv_positions=len(positions))

    def poison_free_blocks(self) -> None:
        """NaN into every free block that holds no cached KV (``kv_oracle.poison``)."""
        from kvspec.harness.engine.kv_oracle import poison

        pool = self.manager.block_pool
        ids = [
            b.block_id
            for b in pool.blocks
            if b.ref_cnt == 0 and not b.is_null and getattr(b, "block_hash", getattr(b, "_block_hash", None)) is None
        ]
        poison([cache for _, layers in self.groups for _, cache, _ in layers], ids)
        self.counts.add(poisoned_blocks=len(ids))

    # --- a workload ------------------------------------------------------------------------------

    def run(self, workload: EngineWorkload) -> dict[int, Any]:
        """The workload on this engine, every check on (``drive.drive``)."""
        return drive(self.llm.llm_engine, workload, self.counts)


def _poisoned(values: Any) -> bool:
    from kvspec.harness.engine.kv_oracle import POISON

    return bool((values == POISON).any())


# --- the process -------------------------------------------------------------------------------------


class Worker:
    """The engines and dense models of one worker process."""

    def __init__(self, root: Path, dtype: str) -> None:
        self.root, self.dtype = root, dtype
        self.engines: dict[tuple[str, bool], EngineUnderCheck] = {}
        self.retired: list[EngineUnderCheck] = []  # set aside after a finding; never torn down (class docstring)
        self.dense: dict[str, Any] = {}
        self.counts = Counts()

    def engine(self, kind: str, caching: bool) -> EngineUnderCheck:
        from kvspec.harness.engine.dense import DenseModel

        if kind not in self.dense:
            self.dense[kind] = DenseModel(write_model(kind, self.root))
        key = (kind, caching)
        if key not in self.engines:
            t = time.monotonic()
            self.engines[key] = EngineUnderCheck(
                kind, caching, self.root / kind, self.dense[kind], self.dtype, self.counts
            )
            self.counts.add(engines_built=1, engine_build_ms=int(1000 * (time.monotonic() - t)))
        return self.engines[key]

    def retire(self, key: tuple[str, bool]) -> None:
        if key in self.engines:
            self.retired.append(self.engines.pop(key))

    def run(self, workload: EngineWorkload, kinds: list[str]) -> dict[str, Any]:
        from kvspec.harness.check.finding import FindingError

        for kind in kinds:
            results: dict[bool, dict[int, Any]] = {}
            for caching in (True, False):
                e = self.engine(kind, caching)
                try:
                    results[caching] = e.run(workload)
                except FindingError as err:
                    self.retire((kind, caching))
                    trace = _shadow_trace(e, err.finding.to_json())
                    return self._found(
                        e,
                        EngineFinding("shadow", err.finding.summary(), {"finding": err.finding.to_json()}, trace),
                    )
                except EngineFinding as f:
                    self.retire((kind, caching))
                    return self._found(e, f)
                except Exception as err:  # noqa: BLE001 - the engine itself failed: a finding of its own
                    self.retire((kind, caching))
                    tb = traceback.format_exc(limit=8)
                    return self._found(
                        e,
                        EngineFinding(
                            "engine-raised", f"the engine raised {type(err).__name__}: {err}", {"traceback": tb}
                        ),
                    )
            try:
                check_outputs(workload, results[True], results[False], self.dense[kind], self.dtype, self.counts)
            except EngineFinding as f:
                return self._found(self.engines[(kind, True)], f, both=True)
        return {"counts": dict(self.counts.c), "finding": None}

    def _found(self, e: EngineUnderCheck, f: EngineFinding, both: bool = False) -> dict[str, Any]:
        """The answer for finding ``f`` on engine ``e`` (``both``: on the two engines' outputs together):
        the engine's config, and its last manager calls as the shadow saw them (for the report)."""
        from kvspec.harness.core.ops_json import op_to_json
        from kvspec.harness.traces.trace import Trace, trace_to_json

        config = trace_to_json(Trace(config=e.config, steps=[], target_name="vllm-engine", target_version=_version()))
        steps = e.sink.lockstep.steps
        last = [{**op_to_json(op), "outcome": out} for op, out in steps[-LAST_CALLS:]]
        where = {"kind": e.kind, "caching": None if both else e.caching, "config_trace": config}
        witness = {**f.witness, "manager_calls": len(steps), f"last_{len(last)}_manager_calls": last}
        return {"counts": dict(self.counts.c), "finding": {**f.to_json(), "witness": witness, **where}}


LAST_CALLS = 12
"""Manager calls before a finding kept in its witness."""


def _shadow_trace(e: EngineUnderCheck, finding: dict[str, Any]) -> dict[str, Any] | None:
    """The shadow's trace of engine ``e`` up to ``finding`` (every manager call since the engine was
    built: it replays from an empty pool on the spec and the real manager), or None when it is longer
    than a trace may be (``MAX_STEPS`` operations, ``MAX_BLOCK_STEPS`` block-steps): the report then
    keeps the workload, which ``kvspec replay --target vllm-engine`` re-runs on fresh engines."""
    from kvspec.harness.traces.trace import MAX_BLOCK_STEPS, MAX_STEPS, Trace, trace_to_json

    steps = e.sink.lockstep.steps
    if len(steps) > MAX_STEPS or len(steps) * int(e.config.num_blocks) > MAX_BLOCK_STEPS:
        return None
    return trace_to_json(
        Trace(config=e.config, steps=list(steps), target_name="vllm", target_version=_version(), finding=finding)
    )


def _version() -> str:
    from kvspec.harness.targets.vllm import vllm_version

    return vllm_version()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kvspec.harness.engine.worker")
    ap.add_argument("--models", required=True, help="folder the tiny models are written to")
    ap.add_argument("--dtype", default="float32", choices=sorted(KV_TOLERANCE))
    ap.add_argument("--mutant", default=None, help="a deliberate engine-path bug (harness.mutants.vllm_engine)")
    args = ap.parse_args(argv)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's prints go to stderr; stdout is the protocol's
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the checks reach into the engine core: in-process
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu" if not _has_cuda() else "cuda")
    if args.mutant:
        from kvspec.harness.mutants.vllm_engine import apply_engine_mutant

        apply_engine_mutant(args.mutant)
    worker = Worker(Path(args.models), args.dtype)
    proto.write(json.dumps({"ready": True, "version": _version()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if "run" in cmd:
            kinds = [k for k in cmd.get("kinds", MODEL_KINDS) if k in MODEL_KINDS]
            answer = worker.run(EngineWorkload.from_json(cmd["run"], "the driver's command"), kinds)
        else:
            answer = {"error": f"unknown command {sorted(cmd)}"}
        proto.write(json.dumps(answer) + "\n")
    return 0


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


if __name__ == "__main__":
    sys.exit(main())
