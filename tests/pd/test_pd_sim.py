"""The P/D simulation: deterministic, its mechanisms visible on small runs, its statistics
(goodput bisection, paired differences, the steady-state check, the analytic estimate) and its
command."""

import json
import math
from dataclasses import replace

import pytest

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.experiment import WORKLOADS, get_workload, measure_drift, run_point
from kvspec.harness.pd.sim.model import PROTOCOLS, Req, Simulation

COSTS = X.ManagerCosts(None)


def run_sim(workload, protocol, load, n, seed=1):
    from kvspec.harness.pd.sim.experiment import get_prefill_capacity

    sim = Simulation(workload, protocol, load * get_prefill_capacity(workload), n, seed, COSTS)
    return sim, sim.run()


def test_deterministic_per_seed():
    a = run_point(WORKLOADS["chat"], "push-concurrent", 0.5, 150, 3, COSTS)
    b = run_point(WORKLOADS["chat"], "push-concurrent", 0.5, 150, 3, COSTS)
    assert a == b and a.finished == 150


def test_layerwise_streaming_hides_the_transfer_at_low_load():
    seq = run_point(WORKLOADS["long"], "push-seq", 0.2, 150, 1, COSTS)
    push = run_point(WORKLOADS["long"], "push-concurrent", 0.2, 150, 1, COSTS)
    layer = run_point(WORKLOADS["long"], "push-concurrent-layerwise", 0.2, 150, 1, COSTS)
    assert layer.ttft_p50_ms < push.ttft_p50_ms < seq.ttft_p50_ms


class Recording(Simulation):
    """Records, at every allocation D makes, when the request's prefill had ended (None: not yet)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.allocations = []

    def answer_allocation(self, t, r):
        done = r.prefill_end if 0.0 < r.prefill_end <= self.now else None
        self.allocations.append((r.rid, done))
        super().answer_allocation(t, r)


def record_allocations(protocol, load=0.9, n=200):
    from kvspec.harness.pd.sim.experiment import get_prefill_capacity

    w = WORKLOADS["long"]
    sim = Recording(w, protocol, load * get_prefill_capacity(w), n, 1, COSTS)
    reqs = sim.run()
    assert all(d.free == sim.capacity for d in sim.decoders)  # every D block back at the end
    return sim.allocations, reqs


def test_sequential_push_never_holds_decode_blocks_before_the_prefill_ends():
    """push-seq (and pull) allocate on D once per request, only after P finished and the router
    relayed it; the concurrent design allocates during P's queue and prefill."""
    for protocol in ("push-seq", "pull"):
        allocations, reqs = record_allocations(protocol)
        assert sorted(rid for rid, _ in allocations) == [r.rid for r in reqs]
        assert all(done is not None for _, done in allocations)
        assert all(r.allocated >= r.prefill_end + 2 * X.ROUTER_HOP_S for r in reqs)
    allocations, reqs = record_allocations("push-concurrent")
    assert sorted(rid for rid, _ in allocations) == [r.rid for r in reqs]
    early = [r for r in reqs if r.allocated < r.prefill_start]
    assert len(early) > len(reqs) / 4  # most wait in P's queue holding D's blocks


def test_reserving_at_arrival_holds_decode_capacity_while_prefill_queues():
    conc = run_point(WORKLOADS["long"], "push-concurrent", 0.95, 300, 1, COSTS)
    jit = run_point(WORKLOADS["long"], "push-concurrent-jit", 0.95, 300, 1, COSTS)
    seq = run_point(WORKLOADS["long"], "push-seq", 0.95, 300, 1, COSTS)
    assert conc.held_idle_frac > 3 * jit.held_idle_frac > 3 * seq.held_idle_frac
    assert conc.held_waiting_for_p_frac > 0.5 * conc.held_idle_frac
    assert seq.held_waiting_for_p_frac == 0.0


def test_pull_frees_p_one_hop_after_the_read_and_push_at_its_last_write():
    _, pull = run_sim(WORKLOADS["chat"], "pull", 0.3, 60)
    _, push = run_sim(WORKLOADS["chat"], "push-seq", 0.3, 60)
    for a, b in zip(pull, push):
        assert a.p_freed is not None and b.p_freed is not None
        assert a.p_freed >= a.allocated + X.TRANSFER_LATENCY_S + X.get_transfer_seconds(a.prompt) + X.PEER_HOP_S - 1e-9
        # push-seq: the registration hop comes before the write instead
        assert b.p_freed >= b.allocated + X.PEER_HOP_S + X.TRANSFER_LATENCY_S + X.get_transfer_seconds(b.prompt) - 1e-9


def p_peak_blocks(reqs: list[Req], p: int) -> int:
    """The most blocks P ``p`` ever held at once, from the requests' hold intervals."""
    events = sorted(
        [(r.prefill_start, r.blocks_remote) for r in reqs if r.p == p]
        + [(r.p_freed, -r.blocks_remote) for r in reqs if r.p == p]
    )
    peak = used = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        used += delta
        peak = max(peak, used)
    return peak


def test_a_full_prefill_instance_stalls_its_next_prefill():
    """With room for one of chat's longest prompts, P must wait for transfers: it stalls, never
    holds more than its capacity, and TTFT grows; unbounded, the same run holds more."""
    blocks = X.get_blocks(2048) + 1
    small = replace(WORKLOADS["chat"], p_kv_fraction=blocks / X.D_BLOCKS)
    sim, reqs = run_sim(small, "pull", 0.9, 300)
    assert sim.p_capacity == blocks and p_peak_blocks(reqs, 0) <= blocks
    assert sim.prefillers[0].stalled_s > 0
    free, free_reqs = run_sim(replace(small, p_kv_fraction=None), "pull", 0.9, 300)
    assert free.prefillers[0].stalled_s == 0 and p_peak_blocks(free_reqs, 0) > blocks  # the check can fail
    stalled = run_point(small, "pull", 0.9, 300, 1, COSTS)
    unbounded = run_point(replace(small, p_kv_fraction=None), "pull", 0.9, 300, 1, COSTS)
    assert stalled.p_stall_frac > 0 == unbounded.p_stall_frac
    assert stalled.ttft_p50_ms > unbounded.ttft_p50_ms


def test_preemption_takes_running_requests_never_loads():
    """D short of blocks preempts running requests (recomputed later), never blocks for KV in
    flight; and every request still finishes."""
    tiny = replace(WORKLOADS["chat"], d_kv_fraction=0.02)
    sim, reqs = run_sim(tiny, "push-concurrent", 0.9, 300)
    victims = [r for r in reqs if r.preemptions]
    assert victims and all(r.admitted is not None for r in victims)
    assert all(r.done is not None for r in reqs)


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
            "--probe-requests",
            "40",
            "--precision",
            "0.2",
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
    results = json.loads((tmp_path / "pd2-sim-results.json").read_text())
    points = results["points"]
    assert sorted(p["protocol"] for p in points) == sorted(PROTOCOLS * 3)
    assert {p["seed"] for p in points} == {1, 2, 3}
    assert sorted(g["protocol"] for g in results["goodputs"]) == sorted(PROTOCOLS * 3)
    assert [e["load"] for e in results["estimates"]] == [0.5]
    tables = (tmp_path / "pd2-sim-tables.md").read_text()
    assert " ± " in tables and "conc − seq" in tables and "Goodput per seed" in tables
    stored = (tmp_path / "pd2-sim-results.json").read_text()
    (tmp_path / "pd2-sim-tables.md").unlink()
    assert main(["pd", "simulate", "--no-figures", "--from-results", str(tmp_path / "pd2-sim-results.json")]) == 0
    assert (tmp_path / "pd2-sim-tables.md").read_text() == tables  # rendered again, the same
    assert (tmp_path / "pd2-sim-results.json").read_text() == stored
    (tmp_path / "broken-sim-results.json").write_text('{"points": [{"nope": 1}]}')
    assert main(["pd", "simulate", "--from-results", str(tmp_path / "broken-sim-results.json")]) == 2
    (tmp_path / "broken-sim-results.json").unlink()
    for bad in (
        ["--workloads", "nope"],
        ["--loads", "x"],
        ["--seeds", "0"],
        ["--workloads", "conv-decode-bound@P-KV=x"],
        ["--workloads", "conv-decode-bound@P-KV=0"],
        ["--workloads", "chat@sigma=1"],  # uniform lengths: no sigma
        ["--workloads", "splitwise-conv@sigma=-1"],
        ["--workloads", "splitwise-conv@nope=1"],
        ["--precision", "0"],
    ):
        assert main(["pd", "simulate", *bad, "--out", str(tmp_path)]) == 2, bad


def test_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from kvspec.harness.pd.sim.analytic import estimate
    from kvspec.harness.pd.sim.figures import draw_all
    from kvspec.harness.pd.sim.goodput import Goodput

    w = WORKLOADS["chat"]
    points = [run_point(w, p, load, 60, k, COSTS) for p in PROTOCOLS for load in (0.3, 0.6) for k in (1, 2, 3)]
    goodputs = [Goodput("chat", p, k, 10.0 + k, 0.5, 0.51, 0.9, 0.8, 5, 60) for p in PROTOCOLS for k in (1, 2)]
    estimates = [estimate(w, load, COSTS) for load in (0.3, 0.6)]
    written = draw_all(points, goodputs, estimates, tmp_path)
    assert {p.name for p in written} == {"pd2-dttft.png", "pd2-held.png", "pd2-goodput.png"}


def test_interval_is_students_t():
    """Known values: n = 10 samples 0..9: mean 4.5, sd 3.0277, t(9) = 2.262 -> half-width 2.166."""
    from kvspec.harness.pd.sim.stats import interval

    mean, hw = interval([float(x) for x in range(10)])
    assert mean == 4.5 and abs(hw - 2.262 * 3.0276503540974917 / 10**0.5) < 1e-9
    assert interval([3.0]) == (3.0, 0.0)
    assert interval([1.0, float("nan"), 3.0])[0] == 2.0


def test_slo_metrics_and_published_shapes():
    """TPOT is per output token after the first; attainment falls once the decode-bound workload's D
    runs out of blocks; lognormal lengths keep their published medians."""
    import random
    import statistics

    from kvspec.harness.pd.sim.inputs import sample_lengths

    w = WORKLOADS["splitwise-conv"]
    rng = random.Random(5)
    prompts, outputs = zip(*(sample_lengths(rng, w) for _ in range(4000)))
    assert abs(statistics.median(prompts) / 1020 - 1) < 0.08 and abs(statistics.median(outputs) / 129 - 1) < 0.08
    light = run_point(WORKLOADS["conv-decode-bound"], "pull", 0.3, 1000, 1, COSTS)
    heavy = run_point(WORKLOADS["conv-decode-bound"], "pull", 1.1, 1000, 1, COSTS)
    assert light.slo_attainment > heavy.slo_attainment and 5 < light.tpot_ms < 50


def test_workload_variants_keep_the_medians_and_widen_the_spread():
    import random
    import statistics

    from kvspec.harness.pd.sim.inputs import sample_lengths

    spread = {}
    for sigma in (0.5, 1.5):
        w = get_workload(f"splitwise-conv@sigma={sigma:g}")
        assert w.name == f"splitwise-conv@sigma={sigma:g}" and w.sigmas == (sigma, sigma)
        rng = random.Random(1)
        prompts = sorted(sample_lengths(rng, w)[0] for _ in range(4000))
        assert abs(statistics.median(prompts) / 1020 - 1) < 0.1
        spread[sigma] = prompts[3000] / prompts[1000]
    assert spread[1.5] > 2 * spread[0.5]
    with pytest.raises(ValueError):
        get_workload("chat@sigma=1")
    assert get_workload("chat@P-KV=unbounded").p_kv_fraction is None
    assert get_workload("conv-decode-bound@P-KV=0.5").p_kv_fraction == 0.5
    assert get_workload("conv-decode-bound").p_kv_fraction == WORKLOADS["conv-decode-bound"].d_kv_fraction


def test_variant_table_pairs_each_variant_with_its_base():
    from kvspec.harness.pd.sim.goodput import Goodput
    from kvspec.harness.pd.sim.report import render_variant_table

    def g(w, p, k, rate):
        return Goodput(w, p, k, rate, 0.5, 0.51, 0.9, 0.8, 5, 60)

    base = [g("conv-decode-bound", p, k, 10.0 + k) for p in PROTOCOLS for k in (1, 2)]
    variant = [g("conv-decode-bound@P-KV=unbounded", p, k, 12.0 + k) for p in PROTOCOLS for k in (2, 1)]
    table = render_variant_table(base + variant)
    assert "| conv-decode-bound@P-KV=unbounded − conv-decode-bound | 2.00 ± 0.00 /" in table
    assert render_variant_table(variant) == ""  # no base run: nothing to compare


def test_bisection_brackets_the_crossing():
    from kvspec.harness.pd.sim.goodput import bisect_load

    step = bisect_load(lambda load: 1.0 if load <= 0.737 else 0.5, precision=0.01)
    assert step.load <= 0.737 < step.above and step.above / step.load - 1 <= 0.01
    low = bisect_load(lambda load: 1.0 if load <= 0.1 else 0.0, precision=0.01)  # below the starting bracket
    assert low.load <= 0.1 < low.above <= 0.102
    assert bisect_load(lambda load: 0.0).load == 0.0
    assert bisect_load(lambda load: 1.0).above == math.inf
    # a curve that dips below the target only above 3.0: found by widening the bracket upwards
    high = bisect_load(lambda load: 0.95 if load < 3.0 else 0.2, precision=0.02)
    assert high.load < 3.0 <= high.above and high.above / high.load - 1 <= 0.02


def test_goodput_is_the_highest_rate_meeting_the_slos():
    """On a toy workload, the rate found meets the target and one at most 3% higher does not."""
    from kvspec.harness.pd.sim.experiment import get_prefill_capacity
    from kvspec.harness.pd.sim.goodput import TARGET, find_goodput

    w = WORKLOADS["chat"]
    g = find_goodput(w, "push-seq", 2, COSTS, 300, precision=0.03)
    assert g.rate == pytest.approx(g.load * get_prefill_capacity(w))
    assert run_point(w, "push-seq", g.load, 300, 2, COSTS).slo_attainment >= TARGET
    assert run_point(w, "push-seq", g.above, 300, 2, COSTS).slo_attainment < TARGET
    assert 1 < g.above / g.load <= 1.03


def test_paired_differences_pair_by_seed():
    from kvspec.harness.pd.sim.stats import get_paired, get_paired_values, interval

    pts = [run_point(WORKLOADS["chat"], p, 0.3, 40, k, COSTS) for k in (3, 1, 2) for p in ("pull", "push-seq")]
    mean, hw, n = get_paired(pts, "ttft_mean_ms", "push-seq", "pull", "chat", 0.3)
    by = {(p.protocol, p.seed): p.ttft_mean_ms for p in pts}
    diffs = [by["push-seq", k] - by["pull", k] for k in (1, 2, 3)]
    assert n == 3 and mean == pytest.approx(sum(diffs) / 3)
    assert hw == pytest.approx(interval(diffs)[1])  # the interval of the per-seed differences
    rows = [("w", "a", 1, 10.0), ("w", "a", 2, 20.0), ("w", "b", 2, 19.0), ("w", "b", 1, 9.0), ("w", "b", 7, 0.0)]
    assert get_paired_values(rows, "a", "b", "w") == (1.0, 0.0, 2)  # seed 7 has no pair


def test_steady_state_check():
    """The drift is the last third's mean TTFT minus the middle third's: zero for a flat run,
    positive for a growing queue; past capacity no point is steady, well below it every one is."""
    from kvspec.harness.pd.sim.stats import aggregate, is_steady

    def req(k, ttft):
        r = Req(k, float(k), 100, 10)
        r.first_token = k + ttft
        return r

    assert measure_drift([req(k, 0.05) for k in range(30)]) == pytest.approx(0.0)
    assert measure_drift([req(k, 0.01 * k) for k in range(30)]) == pytest.approx(100.0)
    w = WORKLOADS["chat"]
    pts = [run_point(w, p, load, 600, k, COSTS) for p in PROTOCOLS for load in (0.3, 1.3) for k in (1, 2, 3, 4)]
    summaries = aggregate(pts)
    assert is_steady(summaries, "chat", 0.3) and not is_steady(summaries, "chat", 1.3)


def test_analytic_estimate_matches_the_simulation():
    """Early dispatch saves 3 hops + D's step wait + allocation (paired, mean TTFT), and holds
    D's blocks as Little's law says; the simulation agrees within 30%."""
    from kvspec.harness.pd.sim.analytic import estimate, get_erlang_c_wait
    from kvspec.harness.pd.sim.stats import get_paired

    assert get_erlang_c_wait(1, 0.5, 1.0) == pytest.approx(1.0)  # M/M/1: rho / (mu - lambda)
    w = WORKLOADS["chat"]
    e = estimate(w, 0.6, COSTS)
    pts = [run_point(w, p, 0.6, 1500, k, COSTS) for p in ("push-seq", "push-concurrent") for k in (1, 2, 3)]
    saved = -get_paired(pts, "ttft_mean_ms", "push-concurrent", "push-seq", "chat", 0.6)[0]
    assert 3 * X.ROUTER_HOP_S * 1e3 < e.saved_ms < 3 * X.ROUTER_HOP_S * 1e3 + e.step_ms
    assert saved == pytest.approx(e.saved_ms, rel=0.3)
    held = sum(p.held_idle_frac for p in pts if p.protocol == "push-concurrent") / 3
    assert held == pytest.approx(e.held_concurrent, rel=0.3)


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
