"""Benchmarks: kvspec's impl allocator vs vLLM 0.33's ``KVCacheManager``; paged attention on GPU.

``python -m kvspec.harness.bench allocator [--requests N] [--steps N] [--seed S]`` replays one generated
decode-heavy trace (admissions with shared prefixes and a prefix-cache lookup, then decode steps of
one token, finishes that free and re-admit) on both managers, checks that both hand out the same
block ids, and prints manager calls per second and the ratio.

``python -m kvspec.harness.bench lockstep`` (``harness.bench.lockstep``): µs per operation of the target's
bare calls, the spec, lockstep and full lockstep, per family and against the pool size.

``python -m kvspec.harness.bench attention`` (CUDA only) times the torch paged path, the Triton kernel and
dense SDPA on a large shuffled pool and prints the achieved KV-read bandwidth.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Step = tuple[str, str, Any]


def decode_heavy_trace(requests: int, steps: int, seed: int, block_size: int = 16) -> list[Step]:
    """``("admit", rid, prompt)``, ``("decode", rid, token)``, ``("free", rid, None)`` steps."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(32000) for _ in range(rng.choice([64, 128, 256]))] for _ in range(8)]
    live: dict[str, int] = {}
    out: list[Step] = []
    n = 0

    def admit() -> None:
        nonlocal n
        n += 1
        rid = f"r{n}"
        prompt = rng.choice(prefixes) + [rng.randrange(32000) for _ in range(rng.randrange(1, 200))]
        out.append(("admit", rid, prompt))
        live[rid] = rng.randrange(50, 400)  # decode length

    for _ in range(requests):
        admit()
    while len(out) < steps:
        rid = rng.choice(list(live))
        live[rid] -= 1
        if live[rid] <= 0:
            out.append(("free", rid, None))
            del live[rid]
            admit()
        else:
            out.append(("decode", rid, rng.randrange(32000)))
    return out


def run_impl(trace: list[Step], num_blocks: int, block_size: int) -> tuple[int, float, list[Any]]:
    from kvspec.impl.allocator import GroupSpec, KVCacheManager, Request
    from kvspec.impl.allocator.hashing import BlockHasher

    m = KVCacheManager([GroupSpec("full", block_size)], num_blocks=num_blocks, max_model_len=1 << 20)
    hasher = BlockHasher(block_size)
    reqs: dict[str, Request] = {}
    results: list[Any] = []
    calls = 0
    t0 = time.perf_counter()
    for kind, rid, arg in trace:
        if kind == "admit":
            r = Request(rid, list(arg), len(arg))
            hasher.extend(r.block_hashes, r.all_token_ids)
            reqs[rid] = r
            hits, n = m.get_computed_blocks(r)
            new = m.allocate_slots(r, r.num_tokens - n, n, hits)
            calls += 2
            r.num_computed_tokens = r.num_tokens
            results.append(new)
        elif kind == "decode":
            r = reqs[rid]
            r.all_token_ids.append(arg)
            hasher.extend(r.block_hashes, r.all_token_ids)
            results.append(m.allocate_slots(r, 1))
            calls += 1
            r.num_computed_tokens += 1
        else:
            m.free(rid)
            calls += 1
            del reqs[rid]
    return calls, time.perf_counter() - t0, results


def run_vllm(trace: list[Step], num_blocks: int, block_size: int) -> tuple[int, float, list[Any]]:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    m = KVCacheManager(cfg, max_model_len=1 << 20, scheduler_block_size=block_size, hash_block_size=block_size)
    hasher = get_request_block_hasher(block_size, sha256)
    reqs: dict[str, Any] = {}
    results: list[Any] = []
    calls = 0
    sp = SamplingParams(max_tokens=1 << 16)
    t0 = time.perf_counter()
    for kind, rid, arg in trace:
        if kind == "admit":
            r = Request(
                request_id=rid, prompt_token_ids=list(arg), sampling_params=sp, pooling_params=None, block_hasher=hasher
            )
            reqs[rid] = r
            hits, n, _ = m.get_computed_blocks(r)
            new = m.allocate_slots(r, r.num_tokens - n, n, hits)
            calls += 2
            r.num_computed_tokens = r.num_tokens
            results.append(None if new is None else tuple(new.get_block_ids()))
        elif kind == "decode":
            r = reqs[rid]
            r.append_output_token_ids(arg)
            new = m.allocate_slots(r, 1)
            calls += 1
            r.num_computed_tokens += 1
            results.append(None if new is None else tuple(new.get_block_ids()))
        else:
            m.free(reqs.pop(rid))
            calls += 1
    return calls, time.perf_counter() - t0, results


def run_spec(trace: list[Step], num_blocks: int, block_size: int) -> tuple[int, float, list[Any]]:
    """The reference model on the same trace (its state is a value: every call copies the pool's
    tuples, so its cost grows with the pool; it is built for the harness' small pools)."""
    from kvspec.spec import kv_cache_manager as m
    from kvspec.spec.config import KVCacheConfig, full_attention
    from kvspec.spec.request import (
        RequestStatus,
        append_output_token_ids,
        make_request,
        with_num_computed_tokens,
        with_status,
    )
    from kvspec.spec.types import BlockCount, TokenCount

    cfg = KVCacheConfig(
        num_blocks=BlockCount(num_blocks), groups=(full_attention(block_size),), max_model_len=TokenCount(1 << 20)
    )
    state = m.init_kv_cache_manager(cfg)
    reqs: dict[str, Any] = {}
    results: list[Any] = []
    calls = 0
    t0 = time.perf_counter()
    for kind, rid, arg in trace:
        if kind == "admit":
            r = make_request(rid, arg, cfg)
            hit = m.get_computed_blocks(state, r)
            state, new = m.allocate_slots(state, r, r.num_tokens - hit.num_hit_tokens, hit.num_hit_tokens, hit)
            calls += 2
            reqs[rid] = with_status(with_num_computed_tokens(r, r.num_tokens), RequestStatus.RUNNING)
            results.append(new)
        elif kind == "decode":
            r = append_output_token_ids(reqs[rid], [arg])
            state, new = m.allocate_slots(state, r, 1)
            calls += 1
            reqs[rid] = with_num_computed_tokens(r, r.num_tokens)
            results.append(new)
        else:
            state = m.free(state, rid)
            calls += 1
            del reqs[rid]
    return calls, time.perf_counter() - t0, results


def oracle_cost(trace: list[Step], num_blocks: int, block_size: int) -> tuple[int, float, float]:
    """Seconds per operation of the impl target with and without the KV-content oracle, on the
    trace as harness operations (each admission and decode runs the model once)."""
    from kvspec.harness.core import ops as O
    from kvspec.harness.oracle.target import KVCheckTarget
    from kvspec.harness.targets.impl import ImplTarget
    from kvspec.spec.config import KVCacheConfig, full_attention
    from kvspec.spec.types import BlockCount, TokenCount

    cfg = KVCacheConfig(
        num_blocks=BlockCount(num_blocks), groups=(full_attention(block_size),), max_model_len=TokenCount(1 << 20)
    )
    program: list[O.Op] = []
    computed: dict[str, int] = {}
    for kind, rid, arg in trace:
        if kind == "admit":
            program += [O.AddRequest(rid, tuple(arg)), O.GetComputedBlocks(rid), O.SetStatus(rid, "RUNNING")]
            computed[rid] = len(arg)
            program += [
                O.AllocateSlots(rid, len(arg), use_computed_blocks=False),
                O.SetNumComputedTokens(rid, len(arg)),
            ]
        elif kind == "decode":
            computed[rid] += 1
            program += [
                O.AppendOutputTokens(rid, (arg,)),
                O.AllocateSlots(rid, 1),
                O.SetNumComputedTokens(rid, computed[rid]),
            ]
        else:
            program.append(O.Free(rid))
    secs = []
    for target in (ImplTarget(), KVCheckTarget(ImplTarget())):
        target.reset(cfg)
        t0 = time.perf_counter()
        for op in program:
            target.apply(op)
        secs.append(time.perf_counter() - t0)
    return len(program), secs[0], secs[1]


def bench_allocator(
    requests: int,
    steps: int,
    seed: int,
    num_blocks: int,
    block_size: int,
    spec_steps: int,
    oracle_steps: int,
    json_path: str | None,
) -> None:
    """impl, vLLM (when installed) and the spec on one decode-heavy trace: calls per second, whether
    they hand out the same block ids, and what the KV oracle costs per operation."""
    trace = decode_heavy_trace(requests, steps, seed, block_size)
    print(
        f"trace: {len(trace)} steps ({sum(s[0] == 'decode' for s in trace)} decodes), {requests} live requests, "
        f"{num_blocks} blocks of {block_size}"
    )
    rates, outs, rows = _run_managers(trace, num_blocks, block_size)
    prefix = trace[:spec_steps]
    calls, secs, res = run_spec(prefix, num_blocks, block_size)
    rates["spec"] = calls / secs
    rows.append((f"spec (first {len(prefix)} steps)", calls, secs))
    same_spec = _block_ids(res) == outs["impl"][: len(res)]
    n_ops, plain, checked = oracle_cost(trace[:oracle_steps], num_blocks, block_size)
    print(f"{'manager':28s} {'calls':>8s} {'seconds':>8s} {'calls/s':>10s}")
    for name, calls, secs in rows:
        print(f"{name:28s} {calls:8d} {secs:8.3f} {calls / secs:10,.0f}")
    report: dict[str, Any] = {
        "trace": {"steps": len(trace), "requests": requests, "num_blocks": num_blocks, "block_size": block_size},
        "ops_per_s": rates,
        "spec_identical_to_impl": same_spec,
        "oracle": {"ops": n_ops, "impl_s": plain, "impl_with_oracle_s": checked},
    }
    report["trace"]["seed"] = seed
    report["oracle"]["ms_per_op"] = 1e3 * (checked - plain) / n_ops
    if "vllm" in rates:
        _compare_with_vllm(rates, outs, report)
    print(f"spec: identical block ids to impl on its {len(prefix)} steps: {same_spec}")
    print(
        f"oracle: {n_ops} harness ops, impl alone {plain:.3f} s, with the KV oracle {checked:.3f} s "
        f"= {report['oracle']['ms_per_op']:.2f} ms per op"
    )
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {json_path}")


def _block_ids(res: list[Any]) -> list[Any]:
    """Each call's block ids, comparable across managers (None for a refused allocation)."""
    return [None if x is None else tuple(tuple(g) for g in x) for x in res]


def _run_managers(
    trace: list[Any], num_blocks: int, block_size: int
) -> tuple[dict[str, float], dict[str, list[Any]], list[tuple[str, int, float]]]:
    """impl, and vLLM when installed, on the whole trace: calls per second, block ids, table rows."""
    runners: list[tuple[str, Callable[..., tuple[int, float, list[Any]]]]] = [("impl", run_impl)]
    try:
        import vllm  # noqa: F401

        runners.append(("vllm", run_vllm))
    except ImportError:
        print("vllm not installed: impl only")
    rates: dict[str, float] = {}
    outs: dict[str, list[Any]] = {}
    rows = []
    for name, fn in runners:
        calls, secs, res = fn(trace, num_blocks, block_size)
        rates[name] = calls / secs
        outs[name] = _block_ids(res)
        rows.append((name, calls, secs))
    return rates, outs, rows


def _compare_with_vllm(rates: dict[str, float], outs: dict[str, list[Any]], report: dict[str, Any]) -> None:
    """impl against vLLM: the speed ratio, and the same block ids (else the benchmark stops)."""
    same = outs["impl"] == outs["vllm"]
    report["impl_over_vllm"] = rates["impl"] / rates["vllm"]
    report["impl_identical_to_vllm"] = same
    print(f"ratio impl/vllm: {rates['impl'] / rates['vllm']:.2f}x; identical block ids: {same}")
    if not same:
        raise SystemExit("impl and vLLM handed out different blocks on the same trace")


def bench_attention() -> None:  # pragma: no cover - GPU only
    import torch

    from kvspec.impl.paged.attention import paged_attention, paged_attention_triton, triton_available

    if not torch.cuda.is_available():
        raise SystemExit("the attention benchmark needs CUDA")
    torch.manual_seed(0)
    nb, bs, hkv, hq, d, seq, t = 32768, 16, 8, 32, 128, 8192, 1
    dt = torch.float16
    kc = torch.randn(nb, bs, hkv, d, device="cuda", dtype=dt)  # [NB, bs, Hkv, D]
    vc = torch.randn_like(kc)  # [NB, bs, Hkv, D]
    table = torch.randperm(nb - 1, device="cuda")[: seq // bs] + 1  # [seq/bs] shuffled ids
    q = torch.randn(t, hq, d, device="cuda", dtype=dt)  # [T, Hq, D] one decode token
    k = kc[table].reshape(seq, hkv, d)  # [seq, Hkv, D] contiguous copy for SDPA
    v = vc[table].reshape(seq, hkv, d)  # [seq, Hkv, D]
    nbytes = 2 * seq * hkv * d * kc.element_size()

    def timeit(fn: Callable[[], Any], n: int = 50) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    def sdpa() -> Any:
        qq = q.transpose(0, 1)[None]  # [1, Hq, T, D]
        kk = k.repeat_interleave(hq // hkv, 1).transpose(0, 1)[None]  # [1, Hq, seq, D]
        vv = v.repeat_interleave(hq // hkv, 1).transpose(0, 1)[None]  # [1, Hq, seq, D]
        return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)

    cases = [
        ("dense SDPA (contiguous)", sdpa),
        ("torch paged", lambda: paged_attention(q, kc, vc, table, seq - 1, "full")),
    ]
    if triton_available():
        cases.append(("triton paged", lambda: paged_attention_triton(q, kc, vc, table, seq - 1, "full")))
    for name, fn in cases:
        s = timeit(fn)
        print(
            f"{name:24s}: {s * 1e6:9.1f} us/decode-step, KV read {nbytes / s / 1e9:8.1f} GB/s "
            f"(seq {seq}, pool {nb} blocks)"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvspec.harness.bench")
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allocator")
    a.add_argument("--requests", type=int, default=64)
    a.add_argument("--steps", type=int, default=100_000)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--num-blocks", type=int, default=16384)
    a.add_argument("--block-size", type=int, default=16)
    a.add_argument(
        "--spec-steps", type=int, default=3000, help="trace prefix the spec replays (its cost grows with the pool)"
    )
    a.add_argument("--oracle-steps", type=int, default=1500, help="trace prefix timed with and without the KV oracle")
    a.add_argument("--json", help="also write the figures as JSON here")
    sub.add_parser("attention")
    from kvspec.harness.bench import lockstep as bench_lockstep

    bench_lockstep.add_parser(sub)
    args = ap.parse_args(argv)
    if args.what == "lockstep":
        bench_lockstep.main(args)
    elif args.what == "allocator":
        bench_allocator(
            args.requests,
            args.steps,
            args.seed,
            args.num_blocks,
            args.block_size,
            args.spec_steps,
            args.oracle_steps,
            args.json,
        )
    else:
        bench_attention()


if __name__ == "__main__":
    main()
