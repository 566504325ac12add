"""Seeds to intervals: the mean of each metric over the seeds of a point, with a 95% confidence
interval (Student's t; the seeds are independent runs); paired differences between designs (the
same seed gives both designs the same arrivals and lengths); the steady-state check.

``report`` renders them as tables, ``figures`` draws the intervals as error bars.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvspec.harness.pd.sim.experiment import Point

# two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond
_T975: tuple[float, ...] = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
)
_T975 += (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

METRICS = (
    "ttft_p50_ms",
    "ttft_p99_ms",
    "ttft_mean_ms",
    "ttft_drift_ms",
    "tpot_ms",
    "slo_attainment",
    "held_idle_frac",
    "p_stall_frac",
    "p_wait_ms",
    "alloc_wait_ms",
)
STEADY_BAND = 0.2  # steady: the drift's 95% interval lies within +-20% of the mean TTFT


def t975(df: int) -> float:
    assert df >= 1, "an interval needs at least two seeds"
    return _T975[df - 1] if df <= len(_T975) else 1.96


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (0 for one sample; NaNs dropped)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    if len(xs) == 1:
        return xs[0], 0.0
    return statistics.fmean(xs), t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


@dataclass(frozen=True)
class Summary:
    workload: str
    protocol: str
    load: float
    seeds: int
    stats: dict[str, tuple[float, float]]


def aggregate(points: list[Point]) -> list[Summary]:
    groups: dict[tuple[str, str, float], list[Point]] = {}
    for p in points:
        groups.setdefault((p.workload, p.protocol, p.load), []).append(p)
    return [
        Summary(w, pr, load, len(ps), {m: interval([getattr(p, m) for p in ps]) for m in METRICS})
        for (w, pr, load), ps in groups.items()
    ]


def get_paired(
    points: list[Point], metric: str, design: str, baseline: str, workload: str, load: float
) -> tuple[float, float, int]:
    """Mean and 95% half-width over seeds of ``metric(design) - metric(baseline)``, each seed's
    pair run on the same arrivals and lengths; and the number of pairs."""
    by_seed: dict[str, dict[int, float]] = {design: {}, baseline: {}}
    for p in points:
        if p.workload == workload and p.load == load and p.protocol in by_seed:
            by_seed[p.protocol][p.seed] = getattr(p, metric)
    seeds = sorted(set(by_seed[design]) & set(by_seed[baseline]))
    mean, hw = interval([by_seed[design][k] - by_seed[baseline][k] for k in seeds])
    return mean, hw, len(seeds)


def is_steady(summaries: list[Summary], workload: str, load: float) -> bool:
    """Every design's drift interval lies within +-STEADY_BAND of its mean TTFT."""
    for s in summaries:
        if s.workload == workload and s.load == load:
            drift, hw = s.stats["ttft_drift_ms"]
            if math.isnan(drift) or abs(drift) + hw > STEADY_BAND * s.stats["ttft_mean_ms"][0]:
                return False
    return True


def get_paired_values(
    rows: list[tuple[str, str, int, float]], design: str, baseline: str, workload: str
) -> tuple[float, float, int]:
    """As ``get_paired`` for per-seed values given as (workload, design, seed, value) rows."""
    a = {k: v for w, d, k, v in rows if w == workload and d == design}
    b = {k: v for w, d, k, v in rows if w == workload and d == baseline}
    seeds = sorted(set(a) & set(b))
    mean, hw = interval([a[k] - b[k] for k in seeds])
    return mean, hw, len(seeds)
