"""The figures of docs/pd-preallocation.md (matplotlib, PNG): each point is the mean over the
seeds, each error bar its 95% confidence interval (``stats``)."""

from __future__ import annotations

from pathlib import Path

from kvspec.harness.pd.sim.experiment import Point
from kvspec.harness.pd.sim.model import PROTOCOLS
from kvspec.harness.pd.sim.stats import Summary, aggregate

STYLE = {
    "baseline": dict(color="black", marker="o", label="baseline (vLLM 0.33: allocate after prefill, pull)"),
    "push": dict(color="tab:blue", marker="s", label="proposal: reserve at arrival, push at end"),
    "push-layerwise": dict(color="tab:green", marker="^", label="proposal + layer-wise streaming"),
    "push-jit": dict(color="tab:orange", marker="v", label="proposal, reserve when the prefill starts"),
}

PANELS = {
    "pd-ttft.png": (
        "Time to first token against load (mean over seeds, 95% CI)",
        (("ttft_p50_ms", "TTFT p50 (ms)", 1.0, True), ("ttft_p99_ms", "TTFT p99 (ms)", 1.0, True)),
    ),
    "pd-slo.png": (
        "Time per output token and SLO attainment (mean over seeds, 95% CI)",
        (("tpot_ms", "TPOT (ms)", 1.0, False), ("slo_attainment", "requests meeting both SLOs (%)", 100.0, False)),
    ),
    "pd-held.png": (
        "Decode KV capacity held by reservations not yet decoding (mean over seeds, 95% CI)",
        (("held_idle_frac", "D's KV blocks held idle (% of capacity)", 100.0, False),),
    ),
}


def _series(s: list[Summary], workload: str, protocol: str, metric: str, scale: float) -> tuple[list[float], ...]:
    pts = sorted((x for x in s if x.workload == workload and x.protocol == protocol), key=lambda x: x.load)
    return (
        [x.load for x in pts],
        [x.stats[metric][0] * scale for x in pts],
        [x.stats[metric][1] * scale for x in pts],
    )


def draw_all(points: list[Point], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    summaries = aggregate(points)
    workloads = list(dict.fromkeys(p.workload for p in points))
    written = []
    for name, (title, rows) in PANELS.items():
        fig, axes = plt.subplots(
            len(rows), len(workloads), figsize=(4.2 * len(workloads), 3.8 * len(rows)), squeeze=False
        )
        for c, w in enumerate(workloads):
            for r, (metric, label, scale, log) in enumerate(rows):
                ax = axes[r][c]
                for proto in PROTOCOLS:
                    xs, ys, es = _series(summaries, w, proto, metric, scale)
                    ax.errorbar(xs, ys, yerr=es, capsize=2, ms=4, lw=1, **STYLE[proto])
                if log:
                    ax.set_yscale("log")
                ax.set_ylabel(label)
                ax.set_xlabel("load (fraction of prefill capacity)")
                ax.grid(alpha=0.3)
            axes[0][c].set_title(w)
        axes[0][0].legend(fontsize=6, loc="upper left")
        fig.suptitle(title)
        path = folder / name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
