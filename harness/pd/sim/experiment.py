"""Sweep the load, run every protocol, and summarise: TTFT p50/p99, throughput, held capacity.

Load is given as a fraction of the prefill side's nominal capacity (``num_prefill`` instances
over the mean prefill time), the resource a P/D deployment is usually sized by.  Requests
arriving in the first and last 10% of the arrival span are left out of the percentiles (warm-up
and drain); throughput counts decoded tokens per second over the arrival span.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.model import PROTOCOLS, Protocol, Req, Simulation, Workload

_CONV = dict(shape="lognormal", prompt=(16, 8192), output=(1, 1024), sigmas=(1.0, 0.8))
WORKLOADS = {
    "chat": Workload("chat", (512, 2048), (128, 384), num_prefill=1, num_decode=1),
    "long": Workload("long", (4096, 12288), (128, 384), num_prefill=2, num_decode=1, slo=(5.0, 0.1)),
    "long-tight": Workload(
        "long-tight", (4096, 12288), (128, 384), num_prefill=2, num_decode=1, d_kv_fraction=0.4, slo=(5.0, 0.1)
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
        medians=(1020, 129),
        **_CONV,  # type: ignore[arg-type]
    ),
}
LOADS = (0.3, 0.6, 0.9, 1.0, 1.1)
DEFAULT_WORKLOADS = ("chat", "long-tight", "splitwise-conv", "splitwise-code", "mooncake", "conv-decode-bound")


@dataclass(frozen=True)
class Point:
    workload: str
    protocol: str
    load: float
    rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    throughput_tok_s: float
    held_idle_frac: float  # mean share of D's blocks allocated to requests not yet decoding
    held_waiting_for_p_frac: float  # the part of it spent before P's prefill ended
    preemptions: int
    finished: int
    seed: int = 1
    tpot_ms: float = float("nan")  # mean time per output token after the first
    slo_attainment: float = float("nan")  # share of requests meeting both SLOs
    goodput_rps: float = float("nan")  # requests per second meeting both SLOs (DistServe)


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


def summarise(w: Workload, protocol: str, load: float, rate: float, sim: Simulation, reqs: list[Req]) -> Point:
    span = reqs[-1].arrival
    lo, hi = 0.1 * span, 0.9 * span
    window = [r for r in reqs if lo <= r.arrival <= hi]
    ttft = [(r.first_token - r.arrival) * 1e3 for r in window if r.first_token is not None]
    tokens = sum(1 for t in sim.tokens_out if t <= span)
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
        tokens / span,
        held / cap,
        waiting / cap,
        sum(r.preemptions for r in reqs),
        sum(1 for r in reqs if r.done is not None),
        sim.seed,
        1e3 * statistics.fmean(tpots.values()) if tpots else float("nan"),
        len(met) / len(window) if window else float("nan"),
        len(met) / (hi - lo) if hi > lo else float("nan"),
    )


def run_point(
    w: Workload, protocol: Protocol, load: float, num_requests: int, seed: int, costs: X.ManagerCosts
) -> Point:
    rate = load * get_prefill_capacity(w)
    sim = Simulation(w, protocol, rate, num_requests, seed, costs)
    return summarise(w, protocol, load, rate, sim, sim.run())


def sweep(
    workloads: list[str],
    loads: tuple[float, ...],
    num_requests: int,
    seed: int,
    costs: X.ManagerCosts,
    progress: Callable[[str], None] | None = None,
    seeds: int = 1,
) -> list[Point]:
    """Every workload x load x protocol, for seeds ``seed .. seed + seeds - 1``."""
    out = []
    total = len(workloads) * len(loads) * len(PROTOCOLS) * seeds
    for name in workloads:
        w = WORKLOADS[name]
        for load in loads:
            for protocol in PROTOCOLS:
                for k in range(seeds):
                    out.append(run_point(w, protocol, load, num_requests, seed + k, costs))
                if progress is not None:
                    p = out[-1]
                    progress(
                        f"[{len(out)}/{total}] {name} load {load:.2f} {protocol} ({seeds} seeds; last): TTFT p50 "
                        f"{p.ttft_p50_ms:.0f} ms, p99 {p.ttft_p99_ms:.0f} ms, TPOT {p.tpot_ms:.1f} ms, "
                        f"SLO met {p.slo_attainment:.0%}, held {p.held_idle_frac:.1%}"
                    )
    return out


def to_json(points: list[Point]) -> list[dict[str, Any]]:
    return [asdict(p) for p in points]


def render_assumptions_table() -> str:
    return "".join(f"| {a.name} | {a.value} | {a.source} |\n" for a in X.ASSUMPTIONS)
