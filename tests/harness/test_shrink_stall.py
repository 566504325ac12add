"""Shrinking stops when it stops helping (``--shrink-stall``, ``harness.check.machine.ShrinkStalled``).

Hypothesis' shrinking of a stateful example makes most of its progress in its first examples and then
crawls (on the vLLM mutants: from 26 to 11 operations in 6 examples, then 7 s for 4 more); kvspec's
reducer finishes the job in under a second.  So shrinking stops once ``--shrink-stall`` examples in a
row found no shorter failing trace, and the reducer starts from the shortest one so far.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from kvspec.harness.check.finding import Finding
from kvspec.harness.check.machine import KVMachine, RunStats, ShrinkStalled, _record_finding
from kvspec.harness.cli import main
from kvspec.harness.core import ops as O
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.traces.replay import replay
from kvspec.harness.traces.trace import Trace, read_trace
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount

CONFIG = KVCacheConfig(BlockCount(8), (full_attention(4),), TokenCount(64))
BUG = ["--target", "mutant:hit_cap_num_tokens", "--family", "full", "--seed", "3"]


def _record(stats: RunStats, n: int) -> None:
    """A failing example of ``n`` operations."""
    steps = [(O.ResetPrefixCache(), True)] * n
    _record_finding(stats, Finding("divergence", n - 1, "differs"), steps, CONFIG)


def _example(stats: RunStats) -> None:
    """The start of one example (what the machine's ``setup`` does first)."""
    KVMachine._check_shrink_progress(SimpleNamespace(stats=stats))  # type: ignore[arg-type]


def test_stops_after_stall_examples_without_a_shorter_trace():
    stats = RunStats(shrink_stall=2)
    _example(stats)  # before any finding: generating, never stopped
    _record(stats, 10)  # the first failing example
    _example(stats)
    _example(stats)  # two shrinking examples without progress: still allowed
    _record(stats, 7)  # progress: the count starts again
    _example(stats)
    _record(stats, 7)  # as long, not shorter: no progress
    _example(stats)
    with pytest.raises(ShrinkStalled):
        _example(stats)
    assert stats.shrink_examples == 5
    assert stats.best is not None and len(stats.best[1]) == 7


def test_no_stall_bound_leaves_hypothesis_bounds_alone():
    stats = RunStats()
    _record(stats, 10)
    for _ in range(1000):
        _example(stats)
    assert stats.shrink_examples == 1000


def test_stall_zero_reduces_the_first_failing_example(tmp_path, capsys):
    """The default: no Hypothesis shrinking, the reducer starts from the first failing example."""
    argv = ["fuzz", *BUG, "--seconds", "60", "--shrink-stall", "0", "--db", str(tmp_path / "db")]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    said = r"\(first failing example after [\d.]+s, \d+ steps, not shrunk \(--shrink-stall 0\), and reduced to \d+\)"
    assert re.search(said, out), out
    (folder,) = (tmp_path / "r").iterdir()
    assert _replays_to_its_finding(read_trace(folder / "trace.json"))
    assert any((tmp_path / "db").rglob("*")), "the failing example is kept in the example database"


def test_stall_reports_the_shortest_trace_reduced(tmp_path, capsys):
    argv = ["fuzz", *BUG, "--seconds", "60", "--shrink-stall", "5", "--db", str(tmp_path / "db")]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    found = re.search(r"shrunk to (\d+) steps in (\d+) examples and reduced to (\d+)", out)
    assert found is not None, out
    shrunk, examples, reduced = map(int, found.groups())
    assert reduced <= shrunk and examples >= 6, out  # at least the stall's examples ran before stopping
    (folder,) = (tmp_path / "r").iterdir()
    assert _replays_to_its_finding(read_trace(folder / "trace.json"))


def _replays_to_its_finding(trace: Trace) -> bool:
    """The report's trace, replayed, ends in the finding it records (kind and step)."""
    got = replay(trace, resolve(trace.target_name).factory).finding
    return (
        got is not None
        and trace.finding is not None
        and (got.kind, got.step)
        == (
            trace.finding["kind"],
            trace.finding["step"],
        )
    )
