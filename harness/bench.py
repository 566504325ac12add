"""Benchmarks: kvspec's impl allocator vs vLLM 0.33's ``KVCacheManager``; paged attention on GPU.

``python -m harness.bench allocator [--requests N] [--steps N] [--seed S]`` replays one generated
decode-heavy trace (admissions with shared prefixes and a prefix-cache lookup, then decode steps of
one token, finishes that free and re-admit) on both managers, checks that both hand out the same
block ids, and prints manager calls per second and the ratio.

``python -m harness.bench attention`` (CUDA only) times the torch paged path, the Triton kernel and
dense SDPA on a large shuffled pool and prints the achieved KV-read bandwidth.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
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
    from impl.allocator import GroupSpec, KVCacheManager, Request
    from impl.hashing import BlockHasher

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


def bench_allocator(requests: int, steps: int, seed: int, num_blocks: int, block_size: int) -> None:
    trace = decode_heavy_trace(requests, steps, seed, block_size)
    print(
        f"trace: {len(trace)} steps ({sum(s[0] == 'decode' for s in trace)} decodes), {requests} live requests, "
        f"{num_blocks} blocks of {block_size}"
    )
    runners: list[tuple[str, Callable[..., tuple[int, float, list[Any]]]]] = [("impl", run_impl)]
    try:
        import vllm  # noqa: F401

        runners.append(("vllm", run_vllm))
    except ImportError:
        print("vllm not installed: impl only")
    rates: dict[str, float] = {}
    outs: dict[str, list[Any]] = {}
    for name, fn in runners:
        calls, secs, res = fn(trace, num_blocks, block_size)
        rates[name] = calls / secs
        outs[name] = [None if x is None else tuple(tuple(g) for g in x) for x in res]
        print(f"{name:5s}: {calls} manager calls in {secs:.3f} s = {rates[name]:,.0f} ops/s")
    if "vllm" in rates:
        same = outs["impl"] == outs["vllm"]
        print(f"ratio impl/vllm: {rates['impl'] / rates['vllm']:.2f}x; identical block ids: {same}")
        if not same:
            raise SystemExit("impl and vLLM handed out different blocks on the same trace")


def bench_attention() -> None:  # pragma: no cover - GPU only
    import torch

    from impl.attention import paged_attention, paged_attention_triton, triton_available

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

    def sdpa():
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
            f"{name:24s}: {s * 1e6:9.1f} us/decode-step, KV read {nbytes / s / 1e9:8.1f} GB/s (seq {seq}, pool {nb} blocks)"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.bench")
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allocator")
    a.add_argument("--requests", type=int, default=64)
    a.add_argument("--steps", type=int, default=100_000)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--num-blocks", type=int, default=16384)
    a.add_argument("--block-size", type=int, default=16)
    sub.add_parser("attention")
    args = ap.parse_args(argv)
    if args.what == "allocator":
        bench_allocator(args.requests, args.steps, args.seed, args.num_blocks, args.block_size)
    else:
        bench_attention()


if __name__ == "__main__":
    main()
