"""Throughput of the vllm target: operations per second through ``apply`` + ``observe``.

Run: ``.venv/bin/python tests/vllm_target/bench_vllm_target.py [--iterations N]`` (needs vLLM 0.33.0).
Prints the import time of vLLM (paid once per process, on the first ``VllmTarget()``), and for a
simple admit / decode / free trace the rate of ``apply`` alone and of ``apply`` + ``observe`` after
every operation (what the lockstep harness does).  Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import time

from kvspec.harness.core.ops import (
    AddRequest,
    AllocateSlots,
    AppendOutputTokens,
    Free,
    GetComputedBlocks,
    Op,
    SetNumComputedTokens,
)
from kvspec.spec.config import KVCacheConfig, full_attention


def simple_trace(iterations: int, block_size: int = 16) -> list[Op]:
    """Per iteration: a 40-token request sharing a 32-token prefix with the others, 8 decode
    steps, then free (the prefix stays cached, so every later lookup hits)."""
    ops: list[Op] = []
    for i in range(iterations):
        rid = f"r{i}"
        prompt = tuple(range(32)) + tuple(range(1000 + 8 * i, 1008 + 8 * i))
        ops += [AddRequest(rid, prompt), GetComputedBlocks(rid)]
        ops.append(AllocateSlots(rid, len(prompt) - 2 * block_size, 2 * block_size, use_computed_blocks=True))
        ops.append(SetNumComputedTokens(rid, len(prompt)))
        for k in range(8):
            ops += [
                AppendOutputTokens(rid, (7,)),
                AllocateSlots(rid, 1),
                SetNumComputedTokens(rid, len(prompt) + k + 1),
            ]
        ops.append(Free(rid))
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--num-blocks", type=int, default=64)
    args = parser.parse_args()

    t0 = time.perf_counter()
    from kvspec.harness.targets.vllm import VllmTarget

    target = VllmTarget()
    print(f"{target.version}: import + first VllmTarget() took {time.perf_counter() - t0:.2f} s")
    config = KVCacheConfig(num_blocks=args.num_blocks, groups=(full_attention(16),), max_model_len=4096)
    ops = simple_trace(args.iterations)

    for with_observe in (False, True):
        target.reset(config)
        start = time.perf_counter()
        for op in ops:
            target.apply(op)
            if with_observe:
                target.observe()
        elapsed = time.perf_counter() - start
        what = "apply + observe" if with_observe else "apply only     "
        print(f"{what}: {len(ops)} ops in {elapsed:.3f} s = {len(ops) / elapsed:,.0f} ops/s ({args.num_blocks} blocks)")


if __name__ == "__main__":
    main()
