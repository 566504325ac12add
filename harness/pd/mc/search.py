"""Breadth-first search over every interleaving, the liveness check, the shortest counterexample.

``explore`` visits every state reachable within the bounds, one canonical representative per
symmetry class (``state.Symmetry``), breadth first, so the first safety violation met ends the
shortest path to one.  Liveness is checked on the finished graph as "no reachable state from
which no path leads to a state where every reservation is released or used" (AG EF), by a
backward search from the goal states; because every run creates finitely many reservations,
this is the same as asking it of each reservation.  Two liveness rules:

- ``reservation_released_or_used``: over the protocol's moves and time-outs (faults are what
  may happen, not what recovers: a crash does not count as releasing);
- ``released_without_timeout``: from every state where no message was lost, over the protocol's
  own moves only (no time-out, no fault): an abort or a finished transfer frees a reservation
  without waiting for a watchdog.

A counterexample is replayed from the initial state, so its step labels name the requests and
instances of one consistent run (not of the canonical representatives).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvspec.harness.pd.mc.model import Bounds
from kvspec.harness.pd.mc.moves import successors
from kvspec.harness.pd.mc.state import HELD, State, Symmetry, init_state
from kvspec.harness.pd.types import Design

EDGE = {"step": 0, "timeout": 1, "fault": 2}
LIVENESS = {
    "reservation_released_or_used": (
        "from every reachable state, protocol moves and time-outs (no further fault) release or use every reservation"
    ),
    "released_without_timeout": "with no message lost, the protocol's own moves release or use every reservation",
}


@dataclass
class Result:
    design: str
    bounds: Bounds
    states: int = 0
    transitions: int = 0
    completed: bool = False
    seconds: float = 0.0
    rule: str | None = None  # the violated rule, None when every rule holds
    message: str = ""
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.completed and self.rule is None


def is_goal(s: State) -> bool:
    return not any(x.ph in HELD for row in s[3] for x in row)


def explore(
    design: Design,
    bounds: Bounds,
    symmetry: bool = True,
    max_states: int = 5_000_000,
    progress: Callable[[int, int], None] | None = None,
) -> Result:
    sym = Symmetry(bounds.requests, bounds.decoders, symmetry)
    start = time.monotonic()
    res = Result(design.name, bounds)
    init = sym.canonical(init_state(bounds.requests, bounds.decoders))
    index: dict[State, int] = {init: 0}
    states: list[State] = [init]
    parent: list[int] = [-1]
    succ: list[list[tuple[int, int]]] = []  # (target, EDGE[kind])
    queue = deque([0])
    while queue:
        i = queue.popleft()
        edges: list[tuple[int, int]] = []
        for step in successors(states[i], design, bounds):
            res.transitions += 1
            c = sym.canonical(step.state)
            j = index.get(c)
            if j is None:
                j = len(states)
                index[c] = j
                states.append(c)
                parent.append(i)
                queue.append(j)
            if step.violation is not None:
                res.rule = step.violation[0]
                res.trace, res.message = replay(design, bounds, sym, states, parent, i, c)
                return _done(res, states, start, completed=True)
            edges.append((j, EDGE[step.kind]))
        succ.append(edges)
        if progress is not None and i % 1000 == 0:
            progress(len(states), res.transitions)
        if len(states) > max_states:
            return _done(res, states, start, completed=False)
    _check_liveness(design, bounds, sym, res, states, parent, succ)
    return _done(res, states, start, completed=True)


def _done(res: Result, states: list[State], start: float, completed: bool) -> Result:
    res.states = len(states)
    res.completed = completed
    res.seconds = time.monotonic() - start
    return res


def backward(succ: list[list[tuple[int, int]]], goal: list[bool], worst: int) -> list[bool]:
    """States from which some path of moves of ``EDGE`` at most ``worst`` reaches ``goal``."""
    n = len(succ)
    pred: list[list[int]] = [[] for _ in range(n)]
    for i, edges in enumerate(succ):
        for j, kind in edges:
            if kind <= worst:
                pred[j].append(i)
    good = list(goal)
    queue = deque(i for i in range(n) if good[i])
    while queue:
        j = queue.popleft()
        for i in pred[j]:
            if not good[i]:
                good[i] = True
                queue.append(i)
    return good


def _check_liveness(
    design: Design,
    bounds: Bounds,
    sym: Symmetry,
    res: Result,
    states: list[State],
    parent: list[int],
    succ: list[list[tuple[int, int]]],
) -> None:
    goal = [is_goal(s) for s in states]
    for rule, worst in (("reservation_released_or_used", EDGE["timeout"]), ("released_without_timeout", EDGE["step"])):
        steps_only = worst == EDGE["step"]
        good = backward(succ, goal, worst)
        # BFS order: the first bad state has the shortest path from the start
        bad = next((i for i, s in enumerate(states) if not good[i] and (not steps_only or s[5] == 0)), None)
        if bad is not None:
            how = "none of the protocol's own moves" if steps_only else "no sequence of protocol moves and time-outs"
            res.rule = rule
            res.trace, last = replay(design, bounds, sym, states, parent, bad, states[bad])
            res.message = f"after the last step, {how} can release or use {last}"
            return


def replay(
    design: Design, bounds: Bounds, sym: Symmetry, states: list[State], parent: list[int], j: int, last: State
) -> tuple[list[str], str]:
    """The labels of one concrete run from the start to (a renaming of) ``last``, and what went
    wrong in that run's names: the violation's message, or the reservations still held."""
    path = []
    k = j
    while k >= 0:
        path.append((states[k], False))
        k = parent[k]
    path.reverse()
    if path[-1][0] != last:  # the last step is the violating one (``j`` is its source)
        path.append((last, True))
    concrete = init_state(bounds.requests, bounds.decoders)
    labels: list[str] = []
    message = ""
    for want, violating in path[1:]:
        for step in successors(concrete, design, bounds):
            if (step.violation is not None or not violating) and sym.canonical(step.state) == want:
                labels.append(step.label)
                concrete = step.state
                message = step.violation[1] if violating and step.violation else ""
                break
        else:  # pragma: no cover - the graph came from these very successors
            raise AssertionError("counterexample replay lost its way")
    held = [f"r{r}@D{d}" for d, row in enumerate(concrete[3]) for r, x in enumerate(row) if x.ph in HELD]
    return labels, message or ", ".join(held)
