"""``kvspec pd verify``: the exhaustive search against a plain brute force, its verdicts on every
design and deliberate bug, and the command's output and exit codes."""

import json
from collections import deque
from dataclasses import replace

import pytest

from kvspec.harness.pd.cli import main
from kvspec.harness.pd.mc.designs import CONTENTION_BUGS, MC_BUGS, MC_DESIGNS, expected_rule, resolve_mc_design
from kvspec.harness.pd.mc.model import CONTENTION, Bounds
from kvspec.harness.pd.mc.moves import successors
from kvspec.harness.pd.mc.search import explore, is_goal
from kvspec.harness.pd.mc.state import RFAIL, Symmetry, init_state

SMALL = Bounds(requests=1, decoders=1, blocks=1, loss=1, dup=0, crash=1)


def brute_force(design, bounds):
    """Every reachable state, no renaming, no shared code with the search but the moves: the
    set of states, the first violation's rule, and whether every state can reach a goal state
    by protocol moves and time-outs (the liveness rule, by plain fixpoint iteration)."""
    start = init_state(bounds.requests, bounds.decoders)
    seen, todo, edges, rule = {start}, deque([start]), {}, None
    while todo:
        s = todo.popleft()
        edges[s] = []
        for step in successors(s, design, bounds):
            if step.violation is not None and rule is None:
                rule = step.violation[0]
            if step.kind != "fault":
                edges[s].append(step.state)
            if step.state not in seen:
                seen.add(step.state)
                todo.append(step.state)
    live = {s for s in seen if is_goal(s)}
    changed = True
    while changed:
        changed = False
        for s in seen - live:
            if any(t in live for t in edges[s]):
                live.add(s)
                changed = True
    return seen, rule, live == seen


@pytest.mark.parametrize("name", ["proposal", "baseline", "vllm-pull-timed"])
def test_search_matches_brute_force_on_passing_designs(name):
    design = MC_DESIGNS[name]
    bounds = Bounds(requests=1, decoders=2, blocks=1, loss=0, dup=0, crash=1)
    seen, rule, live = brute_force(design, bounds)
    assert rule is None and live
    reduced = explore(design, bounds)
    sym = Symmetry(bounds.requests, bounds.decoders)
    assert reduced.ok
    assert reduced.states == len({sym.canonical(s) for s in seen}) < len(seen)


def test_search_matches_brute_force_with_two_requests():
    """Renaming requests (not only decode instances) is sound: under the contention bounds the
    search keeps exactly the canonical states of the brute force's, and fewer."""
    design = MC_DESIGNS["vllm-pull-timed"]
    seen, rule, live = brute_force(design, CONTENTION)
    assert rule is None and live
    reduced = explore(design, CONTENTION)
    sym = Symmetry(CONTENTION.requests, CONTENTION.decoders)
    assert reduced.ok and reduced.states == len({sym.canonical(s) for s in seen}) < len(seen)


def test_brute_force_catches_an_unsound_renaming(monkeypatch):
    """The deliberate bug for the comparison above: a renaming that forgets to rename P's revoke
    tombstones merges states that differ, and the counts no longer match."""
    from kvspec.harness.pd.mc import state as st

    design, bounds = MC_DESIGNS["proposal"], Bounds(requests=1, decoders=2, blocks=1, loss=0, dup=0, crash=1)
    seen, _, _ = brute_force(design, bounds)
    good = st._remap_req
    monkeypatch.setattr(st, "_remap_req", lambda q, dmap: good(q, dmap)._replace(ptomb=q.ptomb))
    broken = explore(design, bounds)
    assert broken.states != len({Symmetry(1, 2).canonical(s) for s in seen})


@pytest.mark.parametrize(
    "name", ["as-written", "as-written-timed", "vllm-push", "vllm-push-timed", "bug:no-revoke-resend"]
)
def test_search_matches_brute_force_on_failing_designs(name):
    design = resolve_mc_design(name)
    seen, rule, live = brute_force(design, SMALL)
    brute = rule or ("reservation_released_or_used" if not live else None)
    found = explore(design, SMALL)
    assert found.completed and found.rule is not None and found.rule == brute
    assert explore(design, SMALL, symmetry=False).rule == found.rule


def test_counterexample_is_shortest_and_replays():
    """Freed on the watchdog while the write flies: 7 steps, none fewer."""
    design = MC_BUGS["release-on-cancel"].design
    r = explore(design, Bounds())
    assert r.rule == "write_lands_in_held_block"
    assert r.trace[-1].startswith("deliver Write(r0@D") and any("watchdog" in t for t in r.trace)
    assert len(r.trace) == 7 == len(explore(design, Bounds(), symmetry=False).trace)


@pytest.mark.parametrize("name", sorted(set(MC_BUGS) - CONTENTION_BUGS))
def test_every_bug_fails_its_rule(name):
    bug = MC_BUGS[name]
    bounds = Bounds(requests=1, decoders=1, blocks=1, loss=1, dup=1, crash=1)
    r = explore(bug.design, bounds)
    assert r.completed and r.rule == expected_rule(bug), (r.rule, r.trace)


@pytest.mark.parametrize("name", sorted(CONTENTION_BUGS))
def test_a_contention_bug_needs_two_requests(name):
    """Invisible to one request against every fault; two requests for one block find it."""
    bug = MC_BUGS[name]
    alone = explore(bug.design, Bounds(requests=1, decoders=1, blocks=1, loss=1, dup=1, crash=1))
    assert alone.ok, (alone.rule, alone.trace)
    r = explore(bug.design, CONTENTION)
    assert r.completed and r.rule == expected_rule(bug), (r.rule, r.trace)


def test_concurrent_dispatch_makes_the_push_leak_need_no_fault():
    """The seed's design on vLLM's push rules (its lease assumed long enough), two requests and
    no fault: a request aborted before its prefill leaves D's registered block held (K10,
    docs/upstream/push-receive-never-ends.md).  vLLM's own push, dispatched to D after P
    answered, holds under the same bounds and leaks only after a fault (a lost registration);
    vLLM's pull holds under both."""
    r = explore(MC_DESIGNS["as-written-timed"], CONTENTION)
    assert r.rule == "reservation_released_or_used" and any("aborted" in t for t in r.trace), r.trace
    assert explore(MC_DESIGNS["vllm-push-timed"], CONTENTION).ok
    f = explore(MC_DESIGNS["vllm-push-timed"], Bounds())
    assert f.rule == "reservation_released_or_used" and any(t.startswith("lose ") for t in f.trace), f.trace
    assert explore(MC_DESIGNS["vllm-pull-timed"], CONTENTION).ok


@pytest.mark.parametrize("name", ["vllm-push-timed", "vllm-pull-timed"])
def test_vllm_designs_queue_where_the_proposal_refuses(name):
    """vLLM's D keeps a request it has no block for waiting: no reachable state of its designs
    has a refusal in flight.  The deliberate bug: the same design refusing instead."""
    design = MC_DESIGNS[name]

    def refusals(g: object) -> int:
        seen, _, _ = brute_force(g, CONTENTION)
        return sum(1 for s in seen for m in s[4] if m[0] == RFAIL)

    assert refusals(design) == 0
    assert refusals(replace(design, queue_when_full=False)) > 0


def test_verify_cli_exit_codes_and_report(tmp_path, capsys):
    out = tmp_path / "v.json"
    flags = ["--requests", "1", "--decoders", "1", "--loss", "0", "--dup", "0"]
    assert main(["verify", "--design", "proposal,baseline", *flags, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bounds custom: 1 request(s)" in text and text.count("search completed") == 2 and "every rule holds" in text
    assert [d["rule"] for d in json.loads(out.read_text())] == [None, None]
    out = tmp_path / "v2.json"  # a new file: pd verify never overwrites one
    assert main(["verify", "--design", "bug:release-on-cancel", *flags, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "VIOLATION of write_lands_in_held_block" in text and "shortest counterexample" in text
    report = json.loads(out.read_text())[0]
    assert report["rule"] == "write_lands_in_held_block" and report["counterexample"]
    assert not list(tmp_path.glob("*.tmp*"))
    assert main(["verify", "--design", "nope"]) == 2
    assert main(["verify", "--blocks", "0"]) == 2
    assert main(["verify", "--max-states", "10", "--requests", "1"]) == 3  # no verdict: neither 0 nor 1
    assert "incomplete" in capsys.readouterr().out
    assert main(["verify", "--bounds", "nope"]) == 2
    # The named sets: two requests for one block, no fault (a design whose search is small).
    assert main(["verify", "--design", "vllm-pull-timed", "--bounds", "contention"]) == 0
    assert "bounds contention: 2 request(s), 1 decode instance(s) with 1 block(s)" in capsys.readouterr().out


@pytest.mark.full
def test_default_bounds_reach_120k_states_and_every_verdict():
    r = explore(MC_DESIGNS["proposal"], Bounds())
    assert r.ok and r.states >= 120_000
    assert explore(MC_DESIGNS["as-written"], Bounds()).rule == "transfer_source_held"
    for name, bug in MC_BUGS.items():
        if name not in CONTENTION_BUGS:
            assert explore(bug.design, Bounds()).rule == expected_rule(bug)


@pytest.mark.full
def test_the_proposal_holds_under_contention():
    """Two requests for one block, no fault: 266,718 states (about 35 s)."""
    r = explore(MC_DESIGNS["proposal"], CONTENTION)
    assert r.ok and r.states >= 250_000
