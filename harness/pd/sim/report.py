"""The tables of docs/pd-simulation.md, rendered from one run's points, goodputs and estimates.

Each design is set against the baseline that isolates its effect (``model.BASELINE_OF``):
sequential push against pull (the transfer direction), each concurrent design against sequential
push (early dispatch).  Cells are mean ± the 95% Student-t half-width over seeds; differences are
paired per seed.  Latency rows that fail the steady-state check are marked and left out of the
difference table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim import stats as S
from kvspec.harness.pd.sim.analytic import Estimate
from kvspec.harness.pd.sim.experiment import Point
from kvspec.harness.pd.sim.goodput import Goodput
from kvspec.harness.pd.sim.model import BASELINE_OF, PROTOCOLS

SHORT = {
    "pull": "pull",
    "push-seq": "seq",
    "push-concurrent": "conc",
    "push-concurrent-layerwise": "conc-lw",
    "push-concurrent-jit": "conc-jit",
}


def cell(mean: float, hw: float, fmt: str, scale: float = 1.0) -> str:
    if math.isnan(mean):
        return "-"
    return f"{format(mean * scale, fmt)} ± {format(hw * scale, fmt)}"


def _stat(summaries: list[S.Summary], w: str, load: float, design: str, metric: str) -> tuple[float, float]:
    for s in summaries:
        if (s.workload, s.load, s.protocol) == (w, load, design):
            return s.stats[metric]
    return float("nan"), float("nan")


def _rows(points: list[Point]) -> list[tuple[str, float]]:
    return list(dict.fromkeys((p.workload, p.load) for p in points))


def render_latency_table(points: list[Point]) -> str:
    """TTFT p50 per design, TPOT and SLO attainment, the drift and the steady-state verdict."""
    summaries = S.aggregate(points)
    head = " / ".join(SHORT[d] for d in PROTOCOLS)
    out = [
        f"| workload | load | TTFT p50 ms: {head} | TPOT ms: seq / conc | SLO met %: seq / conc "
        "| TTFT drift ms (seq) | steady |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, load in _rows(points):
        ttft = " / ".join(cell(*_stat(summaries, w, load, d, "ttft_p50_ms"), ".0f") for d in PROTOCOLS)
        tpot = " / ".join(
            cell(*_stat(summaries, w, load, d, "tpot_ms"), ".1f") for d in ("push-seq", "push-concurrent")
        )
        slo = " / ".join(
            cell(*_stat(summaries, w, load, d, "slo_attainment"), ".0f", 100) for d in ("push-seq", "push-concurrent")
        )
        drift = cell(*_stat(summaries, w, load, "push-seq", "ttft_drift_ms"), ".0f")
        steady = "yes" if S.is_steady(summaries, w, load) else "**no**"
        out.append(f"| {w} | {load:g} | {ttft} | {tpot} | {slo} | {drift} | {steady} |")
    return "\n".join(out) + "\n"


def render_delta_table(points: list[Point], estimates: Iterable[Estimate]) -> str:
    """Paired TTFT differences, each design against its baseline, and the analytic estimate."""
    summaries = S.aggregate(points)
    est = {(e.workload, e.load): e for e in estimates}
    pairs = list(BASELINE_OF.items())
    head = " / ".join(f"{SHORT[d]} − {SHORT[b]}" for d, b in pairs)
    out = [
        f"| workload | load | Δ TTFT p50 ms (paired): {head} | Δ mean TTFT ms, conc − seq: simulated / analytic "
        "| Δ mean TTFT ms, conc-lw − seq: simulated / analytic |",
        "|---|---|---|---|---|",
    ]
    for w, load in _rows(points):
        if not S.is_steady(summaries, w, load):
            out.append(f"| {w} | {load:g} | not steady: left out | | |")
            continue
        deltas = " / ".join(cell(*S.get_paired(points, "ttft_p50_ms", d, b, w, load)[:2], ".1f") for d, b in pairs)
        e = est.get((w, load))
        conc = cell(*S.get_paired(points, "ttft_mean_ms", "push-concurrent", "push-seq", w, load)[:2], ".1f")
        lw = cell(*S.get_paired(points, "ttft_mean_ms", "push-concurrent-layerwise", "push-seq", w, load)[:2], ".1f")
        a_conc = "-" if e is None else f"{-e.saved_ms:.1f}"
        a_lw = "-" if e is None else f"{-e.saved_layerwise_ms:.1f}"
        out.append(f"| {w} | {load:g} | {deltas} | {conc} / {a_conc} | {lw} / {a_lw} |")
    return "\n".join(out) + "\n"


def render_capacity_table(points: list[Point], estimates: Iterable[Estimate]) -> str:
    """D's blocks held idle (simulated and analytic), P's queueing and memory stalls, ΔTPOT."""
    summaries = S.aggregate(points)
    est = {(e.workload, e.load): e for e in estimates}
    out = [
        "| workload | load | D held idle %: seq / conc / conc-jit | analytic: seq / conc / conc-jit "
        "| P queue ms: simulated / analytic | D wait to allocate ms (conc): simulated / analytic step wait "
        "| P stalled %: pull / seq / conc "
        "| Δ TPOT ms, conc − seq |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, load in _rows(points):
        held = " / ".join(
            cell(*_stat(summaries, w, load, d, "held_idle_frac"), ".2f", 100)
            for d in ("push-seq", "push-concurrent", "push-concurrent-jit")
        )
        e = est.get((w, load))
        analytic = (
            "-" if e is None else f"{100 * e.held_seq:.2f} / {100 * e.held_concurrent:.2f} / {100 * e.held_jit:.2f}"
        )
        pq = cell(*_stat(summaries, w, load, "push-seq", "p_wait_ms"), ".0f") + (
            "" if e is None else f" / {e.p_wait_ms:.0f}"
        )
        # concurrent push asks D one hop after arrival: what it waits beyond that is D's step boundary
        aw, aw_hw = _stat(summaries, w, load, "push-concurrent", "alloc_wait_ms")
        wait = cell(aw - X.ROUTER_HOP_S * 1e3, aw_hw, ".1f") + ("" if e is None else f" / {e.step_wait_ms:.1f}")
        stall = " / ".join(
            cell(*_stat(summaries, w, load, d, "p_stall_frac"), ".1f", 100)
            for d in ("pull", "push-seq", "push-concurrent")
        )
        dtpot = cell(*S.get_paired(points, "tpot_ms", "push-concurrent", "push-seq", w, load)[:2], ".2f")
        out.append(f"| {w} | {load:g} | {held} | {analytic} | {pq} | {wait} | {stall} | {dtpot} |")
    return "\n".join(out) + "\n"


def get_goodput_rows(goodputs: list[Goodput]) -> list[tuple[str, str, int, float]]:
    return [(g.workload, g.protocol, g.seed, g.rate) for g in goodputs]


def render_goodput_table(goodputs: list[Goodput]) -> str:
    """Goodput per design (mean ± 95% over seeds) and the paired differences against each baseline."""
    rows = get_goodput_rows(goodputs)
    pairs = list(BASELINE_OF.items())
    head = " / ".join(SHORT[d] for d in PROTOCOLS)
    dhead = " / ".join(f"{SHORT[d]} − {SHORT[b]}" for d, b in pairs)
    out = [
        f"| workload | seeds | goodput req/s: {head} | Δ req/s (paired): {dhead} | Δ %, conc − seq |",
        "|---|---|---|---|---|",
    ]
    for w in dict.fromkeys(g.workload for g in goodputs):
        means = " / ".join(
            cell(*S.interval([v for ww, d, _, v in rows if ww == w and d == p]), ".2f") for p in PROTOCOLS
        )
        deltas = " / ".join(cell(*S.get_paired_values(rows, d, b, w)[:2], ".2f") for d, b in pairs)
        base = S.interval([v for ww, d, _, v in rows if ww == w and d == "push-seq"])[0]
        mean, hw, n = S.get_paired_values(rows, "push-concurrent", "push-seq", w)
        pct = cell(mean / base, hw / base, ".1f", 100) if base else "-"
        out.append(f"| {w} | {n} | {means} | {deltas} | {pct} |")
    return "\n".join(out) + "\n"


def render_variant_table(goodputs: list[Goodput]) -> str:
    """Each workload variant (``NAME@...``) against its base workload, when both were run: the
    paired goodput difference per design (same seeds, so the same arrivals)."""
    rows = get_goodput_rows(goodputs)
    names = list(dict.fromkeys(g.workload for g in goodputs))
    variants = [w for w in names if "@" in w and w.split("@")[0] in names]
    if not variants:
        return ""
    head = " / ".join(SHORT[d] for d in PROTOCOLS)
    out = [f"| variant − base | Δ goodput req/s (paired): {head} |", "|---|---|"]
    for v in variants:
        base = v.split("@")[0]
        deltas = []
        for d in PROTOCOLS:
            a = {k: x for w, dd, k, x in rows if w == v and dd == d}
            b = {k: x for w, dd, k, x in rows if w == base and dd == d}
            deltas.append(cell(*S.interval([a[k] - b[k] for k in sorted(set(a) & set(b))]), ".2f"))
        out.append(f"| {v} − {base} | " + " / ".join(deltas) + " |")
    return "\n".join(out) + "\n"


def render_estimate_table(points: list[Point], estimates: list[Estimate]) -> str:
    """The analytic estimate's terms, and what allocation weighs in the saving."""
    out = [
        "| workload | load | P queue ms | D step ms | D step wait ms | allocation ms | 3 hops ms "
        "| saved ms: analytic / simulated (mean TTFT, paired) | allocation / saved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in estimates:
        sim = S.get_paired(points, "ttft_mean_ms", "push-concurrent", "push-seq", e.workload, e.load)
        out.append(
            f"| {e.workload} | {e.load:g} | {e.p_wait_ms:.0f} | {e.step_ms:.1f} | {e.step_wait_ms:.1f} "
            f"| {e.alloc_ms:.3f} | {3 * X.ROUTER_HOP_S * 1e3:.1f} | {e.saved_ms:.1f} / {cell(-sim[0], sim[1], '.1f')} "
            f"| {e.alloc_ms / e.saved_ms:.1%} |"
        )
    return "\n".join(out) + "\n"


def render_all(points: list[Point], goodputs: list[Goodput], estimates: list[Estimate]) -> str:
    parts = []
    if points:
        parts += [
            "## Latency at steady-state loads\n",
            render_latency_table(points),
            "\n## Paired TTFT differences, each design against its baseline\n",
            render_delta_table(points, estimates),
            "\n## Capacity: D held idle, P queueing, P memory stalls\n",
            render_capacity_table(points, estimates),
        ]
        if estimates:
            parts += [
                "\n## The analytic estimate of early dispatch's saving\n",
                render_estimate_table(points, estimates),
            ]
    if goodputs:
        parts += ["\n## Goodput per seed (bisection)\n", render_goodput_table(goodputs)]
        variants = render_variant_table(goodputs)
        if variants:
            parts += ["\n## Workload variants against their base workload\n", variants]
    return "\n".join(parts)


def from_json(results: dict[str, Any]) -> tuple[list[Point], list[Goodput], list[Estimate]]:
    """The inverse of ``to_json``: a results file back to its points, goodputs and estimates."""
    return (
        [Point(**p) for p in results["points"]],
        [Goodput(**g) for g in results["goodputs"]],
        [Estimate(**e) for e in results["estimates"]],
    )


def to_json(points: list[Point], goodputs: list[Goodput], estimates: list[Estimate], **run: Any) -> dict[str, Any]:
    return {
        **run,
        "points": [asdict(p) for p in points],
        "goodputs": [asdict(g) for g in goodputs],
        "estimates": [asdict(e) for e in estimates],
    }
