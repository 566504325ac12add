"""The machinery every claim shares: the ``Claim`` record, outcomes, and Z3 helpers.

A claim is a named fact about the spec with its premises stated.  Its ``check`` returns an
``Outcome``: ``proven`` (Z3 showed the negation unsatisfiable, or a bounded check covered every
case), ``counterexample`` (Z3 or the bounded check found inputs that satisfy the premises and break
the fact; the values are in ``model``), ``refuted`` (an existence claim, such as "this weak key
function collides", for which no witness exists), or ``unknown`` (solver timeout or incompleteness).

Symbolic claims build their queries by calling ``spec.arith`` *through the module* (``arith.cdiv``,
not ``from spec.arith import cdiv``), so a test that monkeypatches a formula sees the proof use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

PROVEN = "proven"
COUNTEREXAMPLE = "counterexample"
REFUTED = "refuted"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Outcome:
    """What a claim's check found.  ``goal`` names the sub-goal that failed (or ``""``)."""

    status: str
    goal: str = ""
    model: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True)
class Claim:
    """A named, documented fact about the spec.

    ``check(timeout_s)`` decides it; ``premises`` are the assumptions in words (each is also a
    constraint in the query); ``to_trace`` turns a counterexample model into a replayable trace
    dict (see ``harness.proofs.report``), or is None when the claim is about a pure formula whose
    counterexample is just the numbers.
    """

    name: str
    statement: str
    premises: tuple[str, ...]
    check: Callable[[float], Outcome]
    to_trace: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = None
    bound: str = "unbounded integers"


@dataclass(frozen=True)
class Result:
    claim: Claim
    outcome: Outcome
    seconds: float


def fresh_z3_context() -> None:
    """Give the next claim a new default Z3 context.  Z3's search depends on the terms created
    before it (hash-consing order), so a claim that is instant on its own can time out after
    others ran; a fresh context makes each claim's answer independent of the order claims run in."""
    if hasattr(z3.z3, "_main_ctx"):
        z3.z3._main_ctx = None


def run_claim(claim: Claim, timeout_s: float = 20.0) -> Result:
    """Decide one claim in a fresh Z3 context; a Z3 exception or a timeout becomes ``unknown``."""
    fresh_z3_context()
    start = time.perf_counter()
    try:
        outcome = claim.check(timeout_s)
    except z3.Z3Exception as e:
        outcome = Outcome(UNKNOWN, detail=f"Z3 error: {e}")
    return Result(claim, outcome, time.perf_counter() - start)


# --- Z3 helpers ------------------------------------------------------------------------------


def _model_values(model: z3.ModelRef, variables: Sequence[z3.ExprRef]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variables:
        val = model.eval(v, model_completion=True)
        if z3.is_int_value(val):
            out[str(v)] = val.as_long()
        elif z3.is_bv_value(val):
            out[str(v)] = val.as_long()
        elif z3.is_true(val) or z3.is_false(val):
            out[str(v)] = z3.is_true(val)
        elif z3.is_string_value(val):
            out[str(v)] = val.as_string()
        else:
            out[str(v)] = str(val)
    return out


SMALL_BOUNDS = (16, 256)
"""Counterexamples are searched under these bounds first, so reports show small numbers."""


def prove_goals(
    variables: Sequence[z3.ArithRef],
    premises: Sequence[z3.BoolRef],
    goals: Sequence[tuple[str, z3.BoolRef]],
    timeout_s: float,
    shown: Sequence[tuple[str, z3.ExprRef]] = (),
    chain: bool = False,
) -> Outcome:
    """Prove every ``goal`` from ``premises`` over unbounded integers.

    Each goal is checked on its own (``premises and not goal``), so a failure names the goal.  On
    ``sat`` the search is repeated with every integer variable bounded by 16, then 256, and the
    smallest model found is reported (the bounds only shape the counterexample, never the proof).
    ``shown`` adds named derived terms (for instance the formula's result) to the reported model.
    With ``chain`` each proven goal becomes a premise of the goals after it (lemmas first).
    """
    premises = list(premises)
    for goal_name, goal in goals:
        solver = z3.Solver()
        solver.set(timeout=max(1, int(timeout_s * 1000)))
        solver.add(*premises)
        solver.add(z3.Not(goal))
        answer = solver.check()
        if answer == z3.unsat:
            if chain:
                premises.append(goal)
            continue
        if answer == z3.unknown:
            return Outcome(UNKNOWN, goal_name, detail=f"Z3: {solver.reason_unknown()}")
        model = solver.model()
        for bound in SMALL_BOUNDS:
            solver.push()
            solver.add(*[z3.And(v >= -bound, v <= bound) for v in variables if z3.is_int(v)])
            if solver.check() == z3.sat:
                model = solver.model()
                solver.pop()
                break
            solver.pop()
        values = _model_values(model, list(variables))
        for label, term in shown:
            values[label] = _model_values(model, [term])[str(term)]
        return Outcome(COUNTEREXAMPLE, goal_name, values, detail=f"violates: {goal_name}")
    return Outcome(PROVEN)


def find_witness(
    variables: Sequence[z3.ExprRef], constraints: Sequence[z3.BoolRef], timeout_s: float, what: str
) -> Outcome:
    """An existence claim: ``proven`` with the witness in ``model`` when ``constraints`` are
    satisfiable, ``refuted`` when they are not."""
    solver = z3.Solver()
    solver.set(timeout=max(1, int(timeout_s * 1000)))
    solver.add(*constraints)
    answer = solver.check()
    if answer == z3.sat:
        return Outcome(PROVEN, model=_model_values(solver.model(), variables), detail=f"witness: {what}")
    if answer == z3.unsat:
        return Outcome(REFUTED, what, detail=f"no witness exists: {what}")
    return Outcome(UNKNOWN, what, detail=f"Z3: {solver.reason_unknown()}")
