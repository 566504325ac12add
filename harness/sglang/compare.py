"""vLLM's and SGLang's caches on the same workloads, side by side: ``python -m kvspec.harness.sglang.compare``.

For each config and seed, kvspec's world (``harness.world.workload.run_seeded``: requests with shared
prefixes, repeated prompts and conversations, LoRA, salts and images, chunked prefill, preemption,
aborts) drives vLLM 0.33's manager (the spec, block for block) and SGLang 0.5.23's radix cache (the
``sglang`` target) from one ``random.Random(seed)``, with the scheduler features both engines share
(no KV connector, no drafts: ``SGLANG_LIMITS``).  The world reacts to each engine's answers, so the
two runs of a seed start alike and part where the engines decide differently (a hit, a refusal):
the comparison is paired by seed over one workload distribution, not over identical traces.

Per run: the prefix-hit rate (tokens adopted from the cache at admission over the tokens of the
admitted requests), what the cache keeps at the end (blocks holding a key over usable blocks) and
the preemptions.  The table gives each engine's mean over seeds and the paired difference
(SGLang minus vLLM) with a 95% normal interval.

Imports: harness.core, harness.world, harness.targets, harness.sglang, spec.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.sglang.target import SGLANG_LIMITS, SglangTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window
from kvspec.spec.types import BlockCount, TokenCount

CONFIGS = {
    "page 1, 48 blocks": KVCacheConfig(BlockCount(49), (full_attention(1),), TokenCount(64)),
    "page 4, 24 blocks": KVCacheConfig(BlockCount(25), (full_attention(4),), TokenCount(96)),
    "page 16, 12 blocks": KVCacheConfig(BlockCount(13), (full_attention(16),), TokenCount(192)),
    "page 4, full + window 8, 2 x 24 blocks": KVCacheConfig(
        BlockCount(49), (full_attention(4), sliding_window(4, 8)), TokenCount(96)
    ),
}
ENGINES: dict[str, Callable[[], Any]] = {"vLLM 0.33 (spec)": SpecTarget, "SGLang 0.5.23": SglangTarget}


@dataclass
class RunFigures:
    hit_rate: float
    kept: float
    preemptions: int


def run_one(factory: Callable[[], Any], config: KVCacheConfig, seed: int, actions: int) -> RunFigures:
    """One seeded run of the world on a fresh target: its figures (module docstring)."""
    target = factory()
    tokens: dict[str, int] = {}
    hit = admitted = 0

    def on_op(op: O.Op, out: Any) -> None:
        nonlocal hit, admitted
        if isinstance(op, O.AddRequest):
            tokens[op.request_id] = len(op.prompt_token_ids)
        elif isinstance(op, O.AppendOutputTokens):
            tokens[op.request_id] += len(op.token_ids)
        elif isinstance(op, O.AllocateSlots) and op.use_computed_blocks and out is not None:
            hit += op.num_new_computed_tokens
            admitted += tokens[op.request_id]

    w = run_seeded(target, config, seed, actions, on_op=on_op, sched_limits=SGLANG_LIMITS)
    obs = target.observe()
    kept = sum(k is not None for k in obs.block_key[1:]) / (config.num_blocks - 1)
    return RunFigures(hit / admitted if admitted else 0.0, kept, w.sched.counts["preempt"])


def interval(values: list[float]) -> str:
    """``mean ± half-width`` of a 95% normal interval (a single value: no interval)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.3f} ± {half:.3f}"


def compare(seeds: int, actions: int) -> str:
    """The Markdown table (module docstring)."""
    rows = [
        "| config | engine | prefix-hit rate | kept at the end | preemptions per run |",
        "|---|---|---|---|---|",
    ]
    for name, config in CONFIGS.items():
        figures = {e: [run_one(f, config, s, actions) for s in range(seeds)] for e, f in ENGINES.items()}
        for engine, runs in figures.items():
            rows.append(
                f"| {name} | {engine} | {interval([r.hit_rate for r in runs])} | "
                f"{interval([r.kept for r in runs])} | {interval([float(r.preemptions) for r in runs])} |"
            )
        vllm, sglang = figures.values()
        diff = [s.hit_rate - v.hit_rate for v, s in zip(vllm, sglang, strict=True)]
        kept = [s.kept - v.kept for v, s in zip(vllm, sglang, strict=True)]
        rows.append(f"| {name} | SGLang - vLLM (paired) | {interval(diff)} | {interval(kept)} | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvspec.harness.sglang.compare", description=__doc__)
    parser.add_argument("--seeds", type=int, default=40, help="runs per engine and config (default 40)")
    parser.add_argument("--actions", type=int, default=400, help="workload actions per run (default 400)")
    args = parser.parse_args(argv)
    print(f"{args.seeds} seeds x {args.actions} actions per engine and config\n")
    print(compare(args.seeds, args.actions))


if __name__ == "__main__":
    main()
