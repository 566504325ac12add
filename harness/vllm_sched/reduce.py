"""Reduce a finding of the real scheduler's fuzz by re-driving the scheduler with simpler inputs.

A scheduler run is its family, its run seed and the world's draws (``harness.vllm_sched.driver``).
The manager calls it makes are not free to edit: dropping one the scheduler did make can forge the
very bug being reported (a hash published "before its KV was written" because the write was cut),
and ``harness.traces.reduce`` rightly refuses such traces.  So the run is reduced where its inputs are:
named draws of the world are replaced by simpler values (no arrival at this step, no abort, no
reset, no stop token, no remote prefix, no drafts, one output token, no shared prefix, the shortest
suffix), the real scheduler is driven again from the same seed, and a candidate is kept when the
run still ends in the same finding (``harness.traces.reduce.same_finding``) with fewer manager operations.
Each replaced draw still consumes the seeded generator as before, so the draws after it keep their
values.  The overrides are part of the report (``extra.choice_overrides``), and
``kvspec replay --target vllm-scheduler`` applies them.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvspec.harness.vllm_sched.driver import RunResult, draw_config, draw_knobs, run_one
from kvspec.harness.world.choices import Choices
from kvspec.harness.world.workload import SeededChoices

T = TypeVar("T")
Overrides = dict[tuple[str, int], int]

SIMPLER: tuple[tuple[str, int], ...] = (
    ("arrivals", 0),
    ("abort", 1),
    ("reset", 1),
    ("stop", 1),
    ("remote", 0),
    ("draft", 0),
    ("max_tokens", 1),
    ("shared", 0),
    ("suffix_len", 0),
)
"""The draws a reduction may replace, each with its simplest value (clamped to the draw's range)."""

OVERRIDABLE = frozenset(label for label, _ in SIMPLER)
MAX_OVERRIDES = 100_000


class OverriddenChoices:
    """``Choices`` whose ``(label, occurrence)`` integer draws are replaced by given values; every
    draw still asks ``inner`` first, so the draws that follow are the ones the run had."""

    def __init__(self, inner: Choices, overrides: Mapping[tuple[str, int], int]) -> None:
        self.inner, self.overrides = inner, overrides
        self.counts: Counter[str] = Counter()  # integer draws made, per label

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        value = self.inner.integer(lo, hi, label, boundary)
        k = self.counts[label]
        self.counts[label] += 1
        o = self.overrides.get((label, k))
        return value if o is None else min(hi, max(lo, o))

    def boolean(self, label: str) -> bool:
        return self.inner.boolean(label)

    def token(self, label: str) -> int:
        return self.inner.token(label)

    def tokens(self, n: int, label: str) -> tuple[int, ...]:
        return self.inner.tokens(n, label)

    def choice(self, options: Sequence[T], label: str) -> T:
        return self.inner.choice(options, label)


def run_overridden(family: str, seed: int, overrides: Mapping[tuple[str, int], int], **kwargs: Any) -> RunResult:
    """Run ``family`` from ``seed`` as the fuzz does, with ``overrides`` replacing those draws."""
    ch = OverriddenChoices(SeededChoices(random.Random(seed)), overrides)
    config = draw_config(ch, family)
    knobs = draw_knobs(ch, config, family)
    res = run_one(config, knobs, ch, **kwargs)
    res.draws = Counter(ch.counts)
    return res


def overrides_to_json(overrides: Mapping[tuple[str, int], int]) -> list[list[Any]]:
    return [[label, k, v] for (label, k), v in sorted(overrides.items())]


def overrides_from_json(data: Any, where: str) -> Overrides:
    """``extra.choice_overrides`` of a report, checked as data: a ``ValueError`` names the problem."""
    if data is None:
        return {}
    if not isinstance(data, list) or len(data) > MAX_OVERRIDES:
        raise ValueError(f"{where}: extra.choice_overrides must be a list of at most {MAX_OVERRIDES} entries")
    out: Overrides = {}
    for i, entry in enumerate(data):
        ok = isinstance(entry, list) and len(entry) == 3 and entry[0] in OVERRIDABLE
        ok = ok and all(type(x) is int for x in entry[1:]) and 0 <= entry[1] <= 10**6 and abs(entry[2]) <= 10**6
        if not ok:
            raise ValueError(
                f"{where}: extra.choice_overrides[{i}] must be [label, occurrence, value] with a label of "
                f"{', '.join(sorted(OVERRIDABLE))} and ints within 10^6, got {str(entry)[:80]}"
            )
        out[(entry[0], entry[1])] = entry[2]
    return out


@dataclass
class SchedReduction:
    result: RunResult  # the reduced run (ends in the same finding)
    overrides: Overrides
    runs: int  # scheduler runs tried
    seconds: float


def reduce_scheduler_run(
    res: RunResult,
    family: str,
    seed: int,
    seconds: float,
    should_stop: Callable[[], bool] | None = None,
) -> SchedReduction:
    """The run with the fewest manager operations found within ``seconds`` that still ends in
    ``res``'s finding (``res`` itself when nothing simpler does).  Call it where the run happened:
    under the same scheduler mutant, if any."""
    assert res.finding is not None
    t0 = time.monotonic()
    r = _Reducer(res, family, seed, {}, t0 + seconds, should_stop)
    progress = True
    while progress and not r.out_of_time():
        progress = False
        for label, value in SIMPLER:
            progress |= r.replace_runs(label, value)
    return SchedReduction(r.best, r.overrides, r.runs, time.monotonic() - t0)


class _Reducer:
    def __init__(
        self,
        res: RunResult,
        family: str,
        seed: int,
        overrides: Overrides,
        deadline: float,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.best, self.family, self.seed, self.overrides = res, family, seed, overrides
        self.deadline, self.should_stop, self.runs = deadline, should_stop, 0

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline or (self.should_stop is not None and self.should_stop())

    def attempt(self, changes: Overrides) -> bool:
        """Keep the run with ``changes`` if it ends in the same finding with fewer operations."""
        from kvspec.harness.traces.reduce import same_finding

        best = self.best
        assert best.finding is not None
        self.runs += 1
        ov = {**self.overrides, **changes}
        # ``best`` found it in engine step ``best.engine_steps`` (the steps before it completed): a
        # candidate may run that step too, or only those that find it sooner would ever count.
        limits = {"max_engine_steps": best.engine_steps + 1, "deadline": self.deadline}
        r = run_overridden(self.family, self.seed, ov, checks=best.checks, **limits)
        if r.finding is None or not same_finding(r.finding.finding, best.finding.finding) or r.ops >= best.ops:
            return False
        self.best, self.overrides = r, ov
        return True

    def replace_runs(self, label: str, value: int) -> bool:
        """Delta debugging over one label's draws: replace runs of ``n`` of them by ``value``, ``n``
        halving down to one (the draw count is re-read after each success: a simpler run draws less)."""
        progress = False
        n = max(1, self.best.draws[label])
        while n >= 1 and not self.out_of_time():
            i = 0
            while i < self.best.draws[label] and not self.out_of_time():
                end = min(i + n, self.best.draws[label])
                todo = {(label, k): value for k in range(i, end) if self.overrides.get((label, k)) != value}
                if todo and self.attempt(todo):
                    progress = True
                i += n
            n //= 2
        return progress
