"""Seeds to intervals: the mean of each metric over the seeds of a point, with a 95% confidence
interval (Student's t; the seeds are independent runs), and DistServe's goodput.

docs/pd-preallocation.md embeds ``render_table``; ``figures`` draws the intervals as error bars.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvspec.harness.pd.sim.experiment import WORKLOADS, Point, get_prefill_capacity

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

METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_ms", "slo_attainment", "goodput_rps", "held_idle_frac")


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


def goodput_at(summaries: list[Summary], workload: str, protocol: str, target: float = 0.9) -> float:
    """DistServe's goodput: the highest request rate (of the loads run) at which the mean SLO
    attainment is at least ``target``; 0 when none is."""
    ok = [s.load for s in summaries if s.workload == workload and s.protocol == protocol]
    ok = [
        load
        for load in ok
        if next(s for s in summaries if (s.workload, s.protocol, s.load) == (workload, protocol, load)).stats[
            "slo_attainment"
        ][0]
        >= target
    ]
    return max(ok) * get_prefill_capacity(WORKLOADS[workload]) if ok else 0.0


def _cell(stat: tuple[float, float], fmt: str, scale: float = 1.0) -> str:
    mean, hw = stat
    if math.isnan(mean):
        return "-"
    return f"{format(mean * scale, fmt)} ± {format(hw * scale, fmt)}"


def render_table(summaries: list[Summary], loads: tuple[float, ...] | None = None) -> str:
    """Mean ± 95% half-width over the seeds, per workload, load and protocol."""
    rows = [
        "| workload | load | protocol | TTFT p50 (ms) | TTFT p99 (ms) | TPOT (ms) | SLO met (%) "
        "| D blocks held idle (%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in sorted(summaries, key=lambda s: (s.workload, s.load, s.protocol)):
        if loads is not None and s.load not in loads:
            continue
        st = s.stats
        cells = [
            _cell(st["ttft_p50_ms"], ".0f"),
            _cell(st["ttft_p99_ms"], ".0f"),
            _cell(st["tpot_ms"], ".1f"),
            _cell(st["slo_attainment"], ".1f", 100),
            _cell(st["held_idle_frac"], ".2f", 100),
        ]
        rows.append(f"| {s.workload} | {s.load:.1f} | {s.protocol} | " + " | ".join(cells) + " |")
    rows += ["", "| workload | " + " | ".join(p for p in dict.fromkeys(s.protocol for s in summaries)) + " |"]
    rows.append("|---|" + "---|" * len(dict.fromkeys(s.protocol for s in summaries)))
    for w in dict.fromkeys(s.workload for s in summaries):
        goods = [f"{goodput_at(summaries, w, p):.1f}" for p in dict.fromkeys(s.protocol for s in summaries)]
        rows.append(f"| {w} goodput (req/s at >= 90% SLO) | " + " | ".join(goods) + " |")
    return "\n".join(rows) + "\n"
