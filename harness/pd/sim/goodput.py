"""DistServe's goodput per seed, found by bisection on the arrival rate.

Goodput is the highest request rate at which at least 90% of requests meet both SLOs (TTFT and
TPOT).  For one seed the requests are the same at every rate (the same uniforms, arrival times
scaled by 1/rate), so attainment against rate is one curve per seed and design, and the
bisection brackets where it crosses the target: ``load`` meets it, ``above`` (at most
``precision`` higher, relatively) does not.  Rates are reported in requests per second; probes
are run on ``num_requests`` requests each, with the usual 10% warm-up and drain left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.experiment import get_prefill_capacity, map_jobs, run_point
from kvspec.harness.pd.sim.model import PROTOCOLS, Workload

TARGET = 0.9
BRACKET = (0.5, 1.25)  # loads (fractions of prefill capacity) the search starts from
LOWEST_LOAD = 0.01
HIGHEST_LOAD = 8.0


@dataclass(frozen=True)
class Crossing:
    load: float  # the highest load found meeting the target (0.0 when even LOWEST_LOAD fails)
    above: float  # the lowest load found failing it
    attained: float  # attainment at ``load``
    attained_above: float  # attainment at ``above``
    probes: int


@dataclass(frozen=True)
class Goodput:
    workload: str
    protocol: str
    seed: int
    rate: float  # req/s: load x prefill capacity
    load: float
    above: float
    attained: float
    attained_above: float
    probes: int
    requests: int


def bisect_load(
    attain: Callable[[float], float],
    target: float = TARGET,
    precision: float = 0.015,
    bracket: tuple[float, float] = BRACKET,
) -> Crossing:
    """Bracket the crossing of ``attain`` (load -> attainment) through ``target``, then halve the
    bracket geometrically until ``above / load - 1 <= precision``."""
    seen: dict[float, float] = {}

    def probe(load: float) -> float:
        if load not in seen:
            seen[load] = attain(load)
        return seen[load]

    lo, hi = bracket
    while probe(lo) < target:
        if lo <= LOWEST_LOAD:
            return Crossing(0.0, lo, float("nan"), seen[lo], len(seen))
        lo, hi = max(lo / 2, LOWEST_LOAD), lo
    while probe(hi) >= target:
        if hi >= HIGHEST_LOAD:
            return Crossing(hi, float("inf"), seen[hi], float("nan"), len(seen))
        lo, hi = hi, min(hi * 1.5, HIGHEST_LOAD)
    while hi / lo - 1 > precision:
        mid = math.sqrt(lo * hi)
        if probe(mid) >= target:
            lo = mid
        else:
            hi = mid
    return Crossing(lo, hi, seen[lo], seen[hi], len(seen))


def find_goodput(
    w: Workload, protocol: str, seed: int, costs: X.ManagerCosts, num_requests: int, precision: float = 0.015
) -> Goodput:
    """One seed's goodput for one design."""
    crossing = bisect_load(
        lambda load: run_point(w, protocol, load, num_requests, seed, costs).slo_attainment,  # type: ignore[arg-type]
        precision=precision,
    )
    capacity = get_prefill_capacity(w)
    return Goodput(
        w.name,
        protocol,
        seed,
        crossing.load * capacity,
        crossing.load,
        crossing.above,
        crossing.attained,
        crossing.attained_above,
        crossing.probes,
        num_requests,
    )


def goodput_sweep(
    workloads: list[Workload],
    num_requests: int,
    seed: int,
    seeds: int,
    costs: X.ManagerCosts,
    precision: float = 0.015,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> list[Goodput]:
    """Every workload x design x seed."""
    out: list[Goodput] = []
    total = len(workloads) * len(PROTOCOLS) * seeds
    for w in workloads:
        tasks = [(w, pr, seed + k, costs, num_requests, precision) for pr in PROTOCOLS for k in range(seeds)]
        out += map_jobs(find_goodput, tasks, jobs)
        if progress is not None:
            for pr in PROTOCOLS:
                gs = [g for g in out if (g.workload, g.protocol) == (w.name, pr)]
                progress(
                    f"[{len(out)}/{total}] goodput {w.name} {pr} ({seeds} seeds): "
                    + ", ".join(f"{g.rate:.2f}" for g in gs)
                    + f" req/s ({max(g.probes for g in gs)} probes at most)"
                )
    return out
