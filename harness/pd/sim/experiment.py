"""Sweep the load, run every protocol, and summarise: TTFT p50/p99, throughput, held capacity.

Load is given as a fraction of the prefill side's nominal capacity (``num_prefill`` instances
over the mean prefill time), the resource a P/D deployment is usually sized by.  Requests
arriving in the first and last 10% of the arrival span are left out of the percentiles (warm-up
and drain); throughput counts decoded tokens per second over the arrival span.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from harness.pd.sim import inputs as X
from harness.pd.sim.model import PROTOCOLS, Protocol, Req, Simulation, Workload

WORKLOADS = {
    "chat": Workload("chat", (512, 2048), (128, 384), num_prefill=1, num_decode=1),
    "long": Workload("long", (4096, 12288), (128, 384), num_prefill=2, num_decode=1),
    "long-tight": Workload("long-tight", (4096, 12288), (128, 384), num_prefill=2, num_decode=1, d_kv_fraction=0.4),
}
LOADS = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)


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


def get_prefill_capacity(w: Workload) -> float:
    """Requests per second the prefill side can serve (mean prompt)."""
    mean = sum(X.get_prefill_seconds(n) for n in range(w.prompt[0], w.prompt[1] + 1)) / (w.prompt[1] - w.prompt[0] + 1)
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
) -> list[Point]:
    out = []
    total = len(workloads) * len(loads) * len(PROTOCOLS)
    for name in workloads:
        w = WORKLOADS[name]
        for load in loads:
            for protocol in PROTOCOLS:
                out.append(run_point(w, protocol, load, num_requests, seed, costs))
                if progress is not None:
                    p = out[-1]
                    progress(
                        f"[{len(out)}/{total}] {name} load {load:.2f} {protocol}: TTFT p50 {p.ttft_p50_ms:.0f} ms, p99 "
                        f"{p.ttft_p99_ms:.0f} ms, {p.throughput_tok_s:.0f} tok/s, "
                        f"held {p.held_idle_frac:.1%}, {p.preemptions} preemptions"
                    )
    return out


def to_json(points: list[Point]) -> list[dict[str, Any]]:
    return [asdict(p) for p in points]


def median_gain(points: list[Point], workload: str, protocol: str, metric: str, loads: tuple[float, float]) -> float:
    """Median over the loads in ``loads`` of baseline minus ``protocol`` for ``metric``."""
    base = {p.load: getattr(p, metric) for p in points if p.workload == workload and p.protocol == "baseline"}
    other = {p.load: getattr(p, metric) for p in points if p.workload == workload and p.protocol == protocol}
    diffs = [base[k] - other[k] for k in base if k in other and loads[0] <= k <= loads[1]]
    return statistics.median(diffs) if diffs else float("nan")


def render_results_table(points: list[Point], loads: tuple[float, ...] = (0.2, 0.6, 0.9, 1.0, 1.1)) -> str:
    """The results as a Markdown table (docs/pd-preallocation.md embeds it)."""
    rows = [
        "| workload | load | baseline | push | push-layerwise | "
        "push-jit | held: push / jit | preemptions: base / push / jit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by = {(p.workload, p.load, p.protocol): p for p in points}
    for w in dict.fromkeys(p.workload for p in points):
        for load in loads:
            if (w, load, "baseline") not in by:
                continue
            cells = [f"{by[w, load, pr].ttft_p50_ms:.0f} / {by[w, load, pr].ttft_p99_ms:.0f}" for pr in PROTOCOLS]
            held = f"{by[w, load, 'push'].held_idle_frac:.1%} / {by[w, load, 'push-jit'].held_idle_frac:.1%}"
            pre = " / ".join(str(by[w, load, pr].preemptions) for pr in ("baseline", "push", "push-jit"))
            rows.append(f"| {w} | {load:.1f} | " + " | ".join(cells) + f" | {held} | {pre} |")
    return "\n".join(rows) + "\n"


def render_assumptions_table() -> str:
    return "".join(f"| {a.name} | {a.value} | {a.source} |\n" for a in X.ASSUMPTIONS)
