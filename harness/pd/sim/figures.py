"""The figures of docs/pd-preallocation.md (matplotlib, PNG), from the sweep's points."""

from __future__ import annotations

from pathlib import Path

from harness.pd.sim.experiment import Point
from harness.pd.sim.model import PROTOCOLS

STYLE = {
    "baseline": dict(color="black", marker="o", label="baseline (vLLM 0.33: allocate after prefill, pull)"),
    "push": dict(color="tab:blue", marker="s", label="proposal: reserve at arrival, push at end"),
    "push-layerwise": dict(color="tab:green", marker="^", label="proposal + layer-wise streaming"),
    "push-jit": dict(color="tab:orange", marker="v", label="proposal, reserve when the prefill starts"),
}


def _series(points: list[Point], workload: str, protocol: str, metric: str) -> tuple[list[float], list[float]]:
    pts = sorted((p for p in points if p.workload == workload and p.protocol == protocol), key=lambda p: p.load)
    return [p.load for p in pts], [getattr(p, metric) for p in pts]


def _saved(points: list[Point], workload: str, protocol: str, metric: str) -> tuple[list[float], list[float]]:
    xs, base = _series(points, workload, "baseline", metric)
    _, ys = _series(points, workload, protocol, metric)
    return xs, [b - y for b, y in zip(base, ys)]


def draw_all(points: list[Point], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    workloads = list(dict.fromkeys(p.workload for p in points))
    written = []

    def save(fig: object, name: str) -> None:
        path = folder / name
        fig.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
        plt.close(fig)  # type: ignore[arg-type]
        written.append(path)

    fig, axes = plt.subplots(3, len(workloads), figsize=(5 * len(workloads), 11), squeeze=False)
    for c, w in enumerate(workloads):
        for proto in PROTOCOLS:
            axes[0][c].plot(*_series(points, w, proto, "ttft_p50_ms"), **STYLE[proto])
            axes[1][c].plot(*_series(points, w, proto, "ttft_p99_ms"), **STYLE[proto])
            if proto != "baseline":
                axes[2][c].plot(*_saved(points, w, proto, "ttft_p50_ms"), **STYLE[proto])
        axes[0][c].set_title(w)
        axes[0][c].set_yscale("log")
        axes[1][c].set_yscale("log")
        axes[0][c].set_ylabel("TTFT p50 (ms)")
        axes[1][c].set_ylabel("TTFT p99 (ms)")
        axes[2][c].set_ylabel("TTFT p50 saved vs baseline (ms)")
        axes[2][c].axhline(0, color="grey", lw=0.8)
        for r in range(3):
            axes[r][c].set_xlabel("load (fraction of prefill capacity)")
            axes[r][c].grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Time to first token against load")
    save(fig, "pd-ttft.png")

    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7.5), squeeze=False)
    for c, w in enumerate(workloads):
        for proto in PROTOCOLS:
            xs, ys = _series(points, w, proto, "held_idle_frac")
            axes[0][c].plot(xs, [100 * y for y in ys], **STYLE[proto])
            xs, ys = _series(points, w, proto, "throughput_tok_s")
            axes[1][c].plot(xs, ys, **STYLE[proto])
        axes[0][c].set_title(w)
        axes[0][c].set_ylabel("D's KV blocks held idle (% of capacity)")
        axes[1][c].set_ylabel("decode throughput (tokens/s)")
        for r in range(2):
            axes[r][c].set_xlabel("load (fraction of prefill capacity)")
            axes[r][c].grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Decode capacity held by reservations and loads, and throughput")
    save(fig, "pd-held.png")
    return written
