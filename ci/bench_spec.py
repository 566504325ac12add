"""Spec cost on a long scheduler-like trace: operations per second, with and without the
invariant checks the harness runs after every step.

    .venv/bin/python ci/bench_spec.py [--steps 20000] [--blocks 256] [--family full|swa|hybrid]

Prints one table; figures are ratios measured in this run, never asserted.
"""

from __future__ import annotations

import argparse
import random
import time

from kvspec.spec import kv_cache_manager as m
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window
from kvspec.spec.invariants import check_invariants
from kvspec.spec.request import (
    RequestStatus,
    append_output_token_ids,
    make_request,
    with_num_computed_tokens,
    with_status,
)

FAMILIES = {
    "full": (full_attention(16),),
    "swa": (sliding_window(16, 64),),
    "hybrid": (full_attention(16), sliding_window(16, 48)),
}


def make_trace(family: str, num_blocks: int, steps: int, seed: int):
    """Run a small FCFS scheduler on the spec and record each manager call as (name, args)."""
    rng = random.Random(seed)
    cfg = KVCacheConfig(num_blocks=num_blocks, groups=FAMILIES[family], max_model_len=4096)
    state = m.init_kv_cache_manager(cfg)
    prefixes = [[rng.randrange(50) for _ in range(rng.choice((16, 32, 48, 64)))] for _ in range(6)]
    running: dict[str, object] = {}
    calls = []
    n = 0
    while len(calls) < steps:
        if len(running) < 12 and rng.random() < 0.3:
            n += 1
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
            req = make_request(f"r{n}", prompt, cfg)
            hit = m.get_computed_blocks(state, req)
            calls.append(("get_computed_blocks", req))
            new_tokens = req.num_tokens - hit.num_hit_tokens
            state, out = m.allocate_slots(state, req, new_tokens, hit.num_hit_tokens, hit)
            calls.append(("allocate_slots", (req, new_tokens, hit)))
            if out is not None:
                running[req.request_id] = with_status(
                    with_num_computed_tokens(req, req.num_tokens), RequestStatus.RUNNING
                )
        for rid in list(running):
            req = running[rid]
            if rng.random() < 0.05 or req.num_tokens > 1000:
                state = m.free(state, rid)
                calls.append(("free", rid))
                del running[rid]
                continue
            req = append_output_token_ids(req, [rng.randrange(50)])
            state, out = m.allocate_slots(state, req, 1)
            calls.append(("allocate_slots", (req, 1, None)))
            if out is None:  # preempt
                state = m.free(state, rid)
                calls.append(("free", rid))
                del running[rid]
            else:
                running[rid] = with_num_computed_tokens(req, req.num_tokens)
    return cfg, calls


def replay(cfg, calls, check: bool) -> tuple[float, int]:
    state = m.init_kv_cache_manager(cfg)
    live: dict[str, object] = {}
    t0 = time.perf_counter()
    for name, arg in calls:
        if name == "get_computed_blocks":
            live[arg.request_id] = arg
            m.get_computed_blocks(state, arg)
        elif name == "allocate_slots":
            req, new, hit = arg
            live[req.request_id] = req
            if hit is None:
                state, _ = m.allocate_slots(state, req, new)
            else:
                state, _ = m.allocate_slots(state, req, new, hit.num_hit_tokens, hit)
        else:
            state = m.free(state, arg)
            live.pop(arg, None)
        if check:
            violations = check_invariants(
                state, {r: q for r, q in live.items() if any(r in g.req_to_blocks for g in state.groups)}
            )
            assert not violations, violations
    return time.perf_counter() - t0, len(calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{'family':8} {'blocks':>6} {'ops':>7} {'spec ops/s':>11} {'+invariants ops/s':>18} {'check cost':>10}")
    for family in args.family or sorted(FAMILIES):
        cfg, calls = make_trace(family, args.blocks, args.steps, args.seed)
        bare, n = replay(cfg, calls, check=False)
        checked, _ = replay(cfg, calls, check=True)
        print(f"{family:8} {args.blocks:>6} {n:>7} {n / bare:>11,.0f} {n / checked:>18,.0f} {checked / bare:>9.1f}x")


if __name__ == "__main__":
    main()
