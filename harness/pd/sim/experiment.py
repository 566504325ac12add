"""The workloads, and one simulated point summarised: TTFT p50/p99/mean and its drift, TPOT, SLO
attainment, held capacity on D, P's memory stalls.

Load is given as a fraction of the prefill side's nominal capacity (``num_prefill`` instances
over the mean prefill time), the resource a P/D deployment is usually sized by.  Requests
arriving in the first and last 10% of the arrival span are left out of every latency metric
(warm-up and drain); the drift (mean TTFT of the window's last third minus its middle third) says
whether the point reached a steady state.  Throughput counts decoded tokens per second over the
arrival span.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.model import PROTOCOLS, Protocol, Req, Simulation, Workload

T = TypeVar("T")

_CONV = dict(shape="lognormal", prompt=(16, 8192), output=(1, 1024), sigmas=(1.0, 0.8))
WORKLOADS = {
    "chat": Workload("chat", (512, 2048), (128, 384), num_prefill=1, num_decode=1),
    "long": Workload("long", (4096, 12288), (128, 384), num_prefill=2, num_decode=1, slo=(5.0, 0.1)),
    "long-tight": Workload(
        "long-tight",
        (4096, 12288),
        (128, 384),
        num_prefill=2,
        num_decode=1,
        d_kv_fraction=0.4,
        p_kv_fraction=0.4,
        slo=(5.0, 0.1),
    ),
    "splitwise-conv": Workload(
        "splitwise-conv",
        num_prefill=1,
        num_decode=1,
        medians=(1020, 129),
        **_CONV,  # type: ignore[arg-type]
    ),
    "splitwise-code": Workload(
        "splitwise-code",
        num_prefill=1,
        num_decode=1,
        medians=(1500, 13),
        **_CONV,  # type: ignore[arg-type]
    ),
    "mooncake": Workload(
        "mooncake",
        (64, 32768),
        (1, 1024),
        num_prefill=2,
        num_decode=1,
        shape="lognormal",
        medians=(7590 / math.exp(0.5), 182 / math.exp(0.32)),
        sigmas=(1.0, 0.8),
        slo=(5.0, 0.1),
    ),
    # decode-bound: the conversation shape on 2 P : 1 D with a small share of D's KV memory, so
    # D's blocks (not the prefill side) run out first
    "conv-decode-bound": Workload(
        "conv-decode-bound",
        num_prefill=2,
        num_decode=1,
        d_kv_fraction=0.16,
        p_kv_fraction=0.16,  # P gets D's budget
        medians=(1020, 129),
        **_CONV,  # type: ignore[arg-type]
    ),
}
LOADS = (0.3, 0.6, 0.8, 0.9)  # below saturation: latency is reported only where a steady state exists
DEFAULT_WORKLOADS = ("chat", "splitwise-conv", "mooncake", "conv-decode-bound")


def get_workload(spec: str) -> Workload:
    """A workload by name, with variants: ``NAME@sigma=S`` replaces both lognormal sigmas (the
    sensitivity sweep), ``NAME@P-KV=F`` gives each P the fraction F of an H200's KV budget
    (``unbounded``: no limit).  The variant's name is the spec.  KeyError or ValueError when bad."""
    name, *variants = spec.split("@")
    w = replace(WORKLOADS[name], name=spec)
    for v in variants:
        key, _, value = v.partition("=")
        if key == "sigma" and w.shape == "lognormal" and float(value) > 0:
            w = replace(w, sigmas=(float(value), float(value)))
        elif key == "P-KV" and value == "unbounded":
            w = replace(w, p_kv_fraction=None)
        elif key == "P-KV" and float(value) > 0:
            w = replace(w, p_kv_fraction=float(value))
        else:
            raise ValueError(f"bad workload variant {v!r} of {name!r}")
    return w


@dataclass(frozen=True)
class Point:
    workload: str
    protocol: str
    load: float
    rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_mean_ms: float
    ttft_drift_ms: float  # mean TTFT of the window's last third minus its middle third (steady state: ~0)
    throughput_tok_s: float
    held_idle_frac: float  # mean share of D's blocks allocated to requests not yet decoding
    held_waiting_for_p_frac: float  # the part of it spent before P's prefill ended
    p_stall_frac: float  # share of time a P sat idle with work queued, for want of KV memory
    p_wait_ms: float  # mean time in P's queue
    alloc_wait_ms: float  # mean time from asking D for blocks to D allocating them
    preemptions: int
    finished: int
    seed: int = 1
    tpot_ms: float = float("nan")  # mean time per output token after the first
    slo_attainment: float = float("nan")  # share of requests meeting both SLOs


@functools.lru_cache(maxsize=256)
def get_prefill_capacity(w: Workload) -> float:
    """Requests per second the prefill side can serve (mean prefill time of 4000 sampled prompts)."""
    rng = random.Random(0)
    mean = statistics.fmean(X.get_prefill_seconds(X.sample_lengths(rng, w)[0]) for _ in range(4000))
    return w.num_prefill / mean


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def measure_held(sim: Simulation, reqs: list[Req], span: float) -> tuple[float, float]:
    """D's block-seconds held by requests not yet admitted, and the part before P's prefill ended,
    each as a share of D's capacity over the arrival span."""
    held = waiting = 0.0
    for r in reqs:
        if r.allocated is None:
            continue
        end = r.admitted if r.admitted is not None else span
        a, b = max(r.allocated, 0.0), min(end, span)
        if b > a:
            held += r.blocks_remote * (b - a)
            c = min(max(r.prefill_end, a), b)
            waiting += r.blocks_remote * (c - a)
    cap = sim.capacity * len(sim.decoders) * span
    return held / cap, waiting / cap


def measure_drift(window: list[Req]) -> float:
    """Mean TTFT of the last third of the window (by arrival) minus that of its middle third."""
    third = len(window) // 3
    if third == 0:
        return float("nan")
    ttft = [(r.first_token - r.arrival) * 1e3 for r in window if r.first_token is not None]
    return _mean(ttft[2 * third :]) - _mean(ttft[third : 2 * third])


def summarise(w: Workload, protocol: str, load: float, rate: float, sim: Simulation, reqs: list[Req]) -> Point:
    span = reqs[-1].arrival
    lo, hi = 0.1 * span, 0.9 * span
    window = [r for r in reqs if lo <= r.arrival <= hi]
    ttft = [(r.first_token - r.arrival) * 1e3 for r in window if r.first_token is not None]
    tokens = sim.tokens_in_span
    held, waiting = measure_held(sim, reqs, span)
    stalled = sum(p.stalled_s for p in sim.prefillers) / (len(sim.prefillers) * sim.now) if sim.now else 0.0
    tpots = {
        r.rid: (r.done - r.first_token) / (r.output - 1) for r in window if r.done and r.first_token and r.output > 1
    }
    met = [
        r
        for r in window
        if r.first_token is not None
        and r.first_token - r.arrival <= w.slo[0]
        and r.done is not None
        and tpots.get(r.rid, 0.0) <= w.slo[1]
    ]
    return Point(
        w.name,
        protocol,
        load,
        rate,
        percentile(ttft, 0.5),
        percentile(ttft, 0.99),
        _mean(ttft),
        measure_drift(window),
        tokens / span,
        held,
        waiting,
        stalled,
        _mean([(r.prefill_start - r.p_enqueued) * 1e3 for r in window]),
        _mean([(r.allocated - r.reserve_asked) * 1e3 for r in window if r.allocated and r.reserve_asked is not None]),
        sum(r.preemptions for r in reqs),
        sum(1 for r in reqs if r.done is not None),
        sim.seed,
        1e3 * statistics.fmean(tpots.values()) if tpots else float("nan"),
        len(met) / len(window) if window else float("nan"),
    )


def run_point(
    w: Workload, protocol: Protocol, load: float, num_requests: int, seed: int, costs: X.ManagerCosts
) -> Point:
    rate = load * get_prefill_capacity(w)
    sim = Simulation(w, protocol, rate, num_requests, seed, costs)
    return summarise(w, protocol, load, rate, sim, sim.run())


def map_jobs(fn: Callable[..., T], tasks: list[tuple[Any, ...]], jobs: int) -> list[T]:
    """``fn(*task)`` for every task, in order; over ``jobs`` processes when more than one."""
    if jobs <= 1:
        return [fn(*t) for t in tasks]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(fn, *zip(*tasks)))


def sweep(
    workloads: list[Workload],
    loads: tuple[float, ...],
    num_requests: int,
    seed: int,
    costs: X.ManagerCosts,
    progress: Callable[[str], None] | None = None,
    seeds: int = 1,
    jobs: int = 1,
) -> list[Point]:
    """Every workload x load x protocol, for seeds ``seed .. seed + seeds - 1``."""
    out: list[Point] = []
    total = len(workloads) * len(loads) * len(PROTOCOLS) * seeds
    for w in workloads:
        for load in loads:
            tasks = [(w, pr, load, num_requests, seed + k, costs) for pr in PROTOCOLS for k in range(seeds)]
            out += map_jobs(run_point, tasks, jobs)
            if progress is not None:
                p = out[-1]
                progress(
                    f"[{len(out)}/{total}] {w.name} load {load:.2f} ({seeds} seeds; last {p.protocol}): TTFT p50 "
                    f"{p.ttft_p50_ms:.0f} ms, drift {p.ttft_drift_ms:+.0f} ms, TPOT {p.tpot_ms:.1f} ms, "
                    f"SLO met {p.slo_attainment:.0%}, held {p.held_idle_frac:.1%}, P stalled {p.p_stall_frac:.1%}"
                )
    return out


def render_assumptions_table() -> str:
    return "".join(f"| {a.name} | {a.value} | {a.source} |\n" for a in X.ASSUMPTIONS)
