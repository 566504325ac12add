"""The figures of docs/pd-simulation.md (matplotlib, PNG, linear axes): paired differences, each
design minus its baseline (``model.BASELINE_OF``), with 95% intervals over seeds as error bars,
and the analytic estimate (``analytic``) drawn as a dashed line where it predicts the curve.

- ``pd2-dttft.png``: Δ TTFT p50 and Δ mean TTFT against load, one column per workload
  (steady-state loads only).
- ``pd2-held.png``: D's KV blocks held idle against load, simulated and analytic.
- ``pd2-goodput.png``: Δ goodput (% of the baseline's, per seed), one group of bars per workload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvspec.harness.pd.sim import stats as S
from kvspec.harness.pd.sim.analytic import Estimate
from kvspec.harness.pd.sim.experiment import Point
from kvspec.harness.pd.sim.goodput import Goodput
from kvspec.harness.pd.sim.model import BASELINE_OF
from kvspec.harness.pd.sim.report import get_goodput_rows

STYLE: dict[str, dict[str, Any]] = {
    "push-seq": dict(color="black", marker="o", label="push-seq − pull (transfer direction)"),
    "push-concurrent": dict(color="tab:blue", marker="s", label="push-concurrent − push-seq (early dispatch)"),
    "push-concurrent-layerwise": dict(color="tab:green", marker="^", label="push-concurrent-layerwise − push-seq"),
    "push-concurrent-jit": dict(color="tab:orange", marker="v", label="push-concurrent-jit − push-seq"),
}
HELD_STYLE: dict[str, dict[str, Any]] = {
    "push-seq": dict(color="black", marker="o", label="push-seq"),
    "push-concurrent": dict(color="tab:blue", marker="s", label="push-concurrent"),
    "push-concurrent-jit": dict(color="tab:orange", marker="v", label="push-concurrent-jit"),
}
FONT = 10


def _figure(rows: int, cols: int, width: float = 4.4, height: float = 3.4) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": FONT, "legend.fontsize": 9})
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_dttft(points: list[Point], estimates: list[Estimate], path: Path) -> Path:
    """Two rows: Δ TTFT p50 and Δ mean TTFT (the analytic estimate predicts the mean)."""
    summaries = S.aggregate(points)
    workloads = list(dict.fromkeys(p.workload for p in points))
    fig, axes = _figure(2, len(workloads))
    for c, w in enumerate(workloads):
        loads = sorted({p.load for p in points if p.workload == w and S.is_steady(summaries, w, p.load)})
        for r, (metric, label) in enumerate((("ttft_p50_ms", "Δ TTFT p50 (ms)"), ("ttft_mean_ms", "Δ mean TTFT (ms)"))):
            ax = axes[r][c]
            for design, base in BASELINE_OF.items():
                d = [S.get_paired(points, metric, design, base, w, load) for load in loads]
                ax.errorbar(loads, [x[0] for x in d], yerr=[x[1] for x in d], capsize=3, ms=5, lw=1.2, **STYLE[design])
            est = sorted((e.load, -e.saved_ms) for e in estimates if e.workload == w and e.load in loads)
            if est and metric == "ttft_mean_ms":
                ax.plot(*zip(*est), ls="--", color="tab:blue", lw=1, label="analytic: −(3 hops + step wait + alloc)")
            if not loads:
                ax.text(0.5, 0.5, "no steady-state load", transform=ax.transAxes, ha="center")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("load (fraction of prefill capacity)")
            ax.set_ylabel(label + ", paired")
            ax.grid(alpha=0.3)
        axes[0][c].set_title(w, fontsize=FONT + 1)
    handles, labels = axes[1][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=9)
    return _save(fig, path)


def draw_held(points: list[Point], estimates: list[Estimate], path: Path) -> Path:
    summaries = S.aggregate(points)
    workloads = list(dict.fromkeys(p.workload for p in points))
    fig, axes = _figure(1, len(workloads))
    for ax, w in zip(axes[0], workloads):
        for design, style in HELD_STYLE.items():
            pts = sorted(
                (s.load, *s.stats["held_idle_frac"]) for s in summaries if (s.workload, s.protocol) == (w, design)
            )
            ax.errorbar(
                [x[0] for x in pts], [100 * x[1] for x in pts], yerr=[100 * x[2] for x in pts], capsize=3, ms=5, **style
            )
        est = sorted((e.load, 100 * e.held_concurrent, 100 * e.held_jit) for e in estimates if e.workload == w)
        if est:
            ax.plot([e[0] for e in est], [e[1] for e in est], ls="--", color="tab:blue", lw=1, label="analytic, conc")
            ax.plot([e[0] for e in est], [e[2] for e in est], ls=":", color="tab:orange", lw=1, label="analytic, jit")
        ax.set_title(w, fontsize=FONT + 1)
        ax.set_xlabel("load (fraction of prefill capacity)")
        ax.set_ylabel("D's KV blocks held idle (% of D)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=9)
    return _save(fig, path)


def draw_goodput(goodputs: list[Goodput], path: Path) -> Path:
    """Per-seed relative differences (design over its baseline, %), mean and 95% interval."""
    rows = get_goodput_rows(goodputs)
    workloads = list(dict.fromkeys(g.workload for g in goodputs))
    fig, axes = _figure(1, 1, width=max(6.0, 1.9 * len(workloads) + 1.5), height=4.0)
    ax = axes[0][0]
    width = 0.8 / len(BASELINE_OF)
    for k, (design, base) in enumerate(BASELINE_OF.items()):
        d = []
        for w in workloads:
            a = {s: v for ww, p, s, v in rows if ww == w and p == design}
            b = {s: v for ww, p, s, v in rows if ww == w and p == base}
            d.append(S.interval([100 * (a[s] / b[s] - 1) for s in sorted(set(a) & set(b)) if b[s] > 0]))
        xs = [i + (k - (len(BASELINE_OF) - 1) / 2) * width for i in range(len(workloads))]
        style = STYLE[design]
        ax.bar(
            xs, [x[0] for x in d], width, yerr=[x[1] for x in d], capsize=3, color=style["color"], label=style["label"]
        )
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(workloads)), workloads, fontsize=9)
    ax.set_ylabel("Δ goodput (% of the baseline's), paired")
    ax.grid(alpha=0.3, axis="y")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=1, fontsize=9)
    return _save(fig, path)


def draw_all(
    points: list[Point], goodputs: list[Goodput], estimates: list[Estimate], folder: Path, prefix: str = "pd2"
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if points:
        written.append(draw_dttft(points, estimates, folder / f"{prefix}-dttft.png"))
        written.append(draw_held(points, estimates, folder / f"{prefix}-held.png"))
    if goodputs:
        written.append(draw_goodput(goodputs, folder / f"{prefix}-goodput.png"))
    return written
