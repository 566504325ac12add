"""The P/D simulation: deterministic, its mechanisms visible on small runs, and its command."""

import json

import pytest

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.experiment import WORKLOADS, run_point
from kvspec.harness.pd.sim.model import PROTOCOLS

COSTS = X.ManagerCosts(None)


def test_deterministic_per_seed():
    a = run_point(WORKLOADS["chat"], "push", 0.5, 150, 3, COSTS)
    b = run_point(WORKLOADS["chat"], "push", 0.5, 150, 3, COSTS)
    assert a == b and a.finished == 150


def test_layerwise_streaming_hides_the_transfer_at_low_load():
    base = run_point(WORKLOADS["long"], "baseline", 0.2, 150, 1, COSTS)
    push = run_point(WORKLOADS["long"], "push", 0.2, 150, 1, COSTS)
    layer = run_point(WORKLOADS["long"], "push-layerwise", 0.2, 150, 1, COSTS)
    assert layer.ttft_p50_ms < push.ttft_p50_ms < base.ttft_p50_ms


def test_reserving_at_arrival_holds_decode_capacity_while_prefill_queues():
    push = run_point(WORKLOADS["long"], "push", 1.1, 300, 1, COSTS)
    jit = run_point(WORKLOADS["long"], "push-jit", 1.1, 300, 1, COSTS)
    base = run_point(WORKLOADS["long"], "baseline", 1.1, 300, 1, COSTS)
    assert push.held_idle_frac > 3 * jit.held_idle_frac > 3 * base.held_idle_frac
    assert push.held_waiting_for_p_frac > 0.5 * push.held_idle_frac


def test_manager_costs_interpolate():
    costs = X.ManagerCosts(
        {
            "median_s": {
                "8": {"allocate_slots": 1e-5, "get_computed_blocks": 0.0},
                "64": {"allocate_slots": 3e-5, "get_computed_blocks": 0.0},
            }
        }
    )
    assert costs.get("allocate_slots", 36) == pytest.approx(2e-5)
    assert costs.get("allocate_slots", 4) == 1e-5 and costs.get("allocate_slots", 500) == 3e-5
    assert X.ManagerCosts(None).admission(10) == 0.0


def test_simulate_command(tmp_path, capsys):
    from kvspec.harness.cli import main
    from kvspec.harness.pd.cli import _parser

    assert not _parser().parse_args(["simulate"]).out.startswith("docs")  # tracked files only when asked

    rc = main(
        [
            "pd",
            "simulate",
            "--no-measure",
            "--no-figures",
            "--requests",
            "40",
            "--seeds",
            "3",
            "--loads",
            "0.5",
            "--workloads",
            "chat",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    wrote = capsys.readouterr().err.split("; wrote ")[-1].strip().split(", ")
    assert sorted(wrote) == sorted(str(p) for p in tmp_path.iterdir())  # every file it wrote, said
    results = json.loads((tmp_path / "pd-sim-results.json").read_text())
    points = results["points"]
    assert sorted(p["protocol"] for p in points) == sorted(PROTOCOLS * 3)
    assert {p["seed"] for p in points} == {1, 2, 3} and len(results["summaries"]) == len(PROTOCOLS)
    assert " ± " in (tmp_path / "pd-sim-table.md").read_text()
    assert main(["pd", "simulate", "--workloads", "nope", "--out", str(tmp_path)]) == 2
    assert main(["pd", "simulate", "--loads", "x", "--out", str(tmp_path)]) == 2
    assert main(["pd", "simulate", "--seeds", "0", "--out", str(tmp_path)]) == 2


def test_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from kvspec.harness.pd.sim.figures import draw_all

    points = [run_point(WORKLOADS["chat"], p, load, 30, 1, COSTS) for p in PROTOCOLS for load in (0.3, 0.6)]
    assert {p.name for p in draw_all(points, tmp_path)} == {"pd-ttft.png", "pd-slo.png", "pd-held.png"}


def test_interval_is_students_t():
    """Known values: n = 10 samples 0..9: mean 4.5, sd 3.0277, t(9) = 2.262 -> half-width 2.166."""
    from kvspec.harness.pd.sim.stats import interval

    mean, hw = interval([float(x) for x in range(10)])
    assert mean == 4.5 and abs(hw - 2.262 * 3.0276503540974917 / 10**0.5) < 1e-9
    assert interval([3.0]) == (3.0, 0.0)
    assert interval([1.0, float("nan"), 3.0])[0] == 2.0


def test_slo_metrics_and_published_shapes():
    """TPOT is per output token after the first; goodput falls once the decode-bound workload's D
    runs out of blocks; lognormal lengths keep their published medians."""
    import random
    import statistics

    from kvspec.harness.pd.sim.inputs import sample_lengths

    w = WORKLOADS["splitwise-conv"]
    rng = random.Random(5)
    prompts, outputs = zip(*(sample_lengths(rng, w) for _ in range(4000)))
    assert abs(statistics.median(prompts) / 1020 - 1) < 0.08 and abs(statistics.median(outputs) / 129 - 1) < 0.08
    light = run_point(WORKLOADS["conv-decode-bound"], "baseline", 0.3, 1000, 1, COSTS)
    heavy = run_point(WORKLOADS["conv-decode-bound"], "baseline", 1.1, 1000, 1, COSTS)
    assert light.slo_attainment > heavy.slo_attainment and 5 < light.tpot_ms < 50


def test_check_command_exit_codes(tmp_path, capsys):
    from kvspec.harness.cli import main

    assert main(["pd", "check", "--scenarios"]) == 0
    capsys.readouterr()
    assert main(["pd", "check", "--design", "proposal", "--seconds", "2", "--batch", "10", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "proposal: no finding" in out and "[proposal]" not in err  # no progress lines to a non-terminal
    assert (
        main(
            [
                "pd",
                "check",
                "--design",
                "bug:forget-free",
                "--seconds",
                "20",
                "--batch",
                "30",
                "--shrink-seconds",
                "5",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert list(tmp_path.glob("*.md"))
    assert main(["pd", "check", "--design", "nope"]) == 2
    assert main(["pd", "check", "--invariant", "nope"]) == 2
    assert main(["pd", "bogus"]) == 2
