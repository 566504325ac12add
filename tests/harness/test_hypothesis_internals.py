"""Hypothesis' private attributes that kvspec relies on (``harness.check.hypothesis_run``) are where
they were, of the same kind, and still honoured: a Hypothesis release that moves or changes one
fails here, naming it, instead of silently changing seeds, database keys or how long shrinking runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import hypothesis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from kvspec.harness.check.hypothesis_run import (
    HYPOTHESIS_VERSION,
    SLOW_SHRINKING_WARNING,
    cap_shrinking,
    run_as_test,
    without_slow_shrinking_warning,
)

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1000  # a failing ``Drawing`` fails on a draw of at least this; shrinking ends at exactly this


def broken(attribute: str, what: str) -> str:
    """The failure message: the attribute, what changed, and the release the helper was checked against."""
    return (
        f"Hypothesis {hypothesis.__version__}: {attribute} {what}. harness/check/hypothesis_run.py was "
        f"checked against Hypothesis {HYPOTHESIS_VERSION} (pinned in pyproject.toml and ci/requirements.txt)"
    )


class Drawing(RuleBasedStateMachine):
    """Records every integer it draws; with ``fail_at`` set, fails on a draw of at least that (and
    first caps shrinking to ``cap`` seconds, when set)."""

    drawn: list[int]
    fail_at: int | None = None
    cap: int | None = None

    @rule(n=st.integers(0, 10**6))
    def draw(self, n: int) -> None:
        type(self).drawn.append(n)
        if self.fail_at is not None and n >= self.fail_at:
            if self.cap is not None:
                cap_shrinking(self.cap)
            raise AssertionError(f"drew {n}")


def run(
    seed: int,
    name: str = "Drawing",
    fail: bool = False,
    shrink_seconds: int = 60,
    cap: int | None = None,
    database: ExampleDatabase | None = None,
) -> list[int]:
    """Every integer one run of a fresh ``Drawing`` class draws, in order (through ``run_as_test``)."""
    cls = type(name, (Drawing,), {"drawn": [], "fail_at": LIMIT if fail else None, "cap": cap})

    def factory() -> Drawing:
        return cls()

    hyp = settings(
        max_examples=10,
        stateful_step_count=5,
        deadline=None,
        database=database,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    if fail:
        with pytest.raises(AssertionError, match="drew"):
            run_as_test(factory, name, hyp, seed, shrink_seconds)
    else:
        run_as_test(factory, name, hyp, seed, shrink_seconds)
    return cls.drawn


def test_the_checked_version_is_the_pinned_one() -> None:
    for path in ("pyproject.toml", "ci/requirements.txt"):
        pins = re.findall(r"hypothesis==([\w.]+)", (ROOT / path).read_text())
        assert pins == [HYPOTHESIS_VERSION], (
            f"{path} pins Hypothesis {pins}, but harness/check/hypothesis_run.py was checked against "
            f"{HYPOTHESIS_VERSION}: check its private attributes against the new pin, then update HYPOTHESIS_VERSION"
        )


def test_the_shrinking_bound_is_a_number_of_seconds() -> None:
    bound = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    assert bound is not None, broken("hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS", "is gone")
    assert isinstance(bound, int | float) and not isinstance(bound, bool) and bound > 0, broken(
        "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS", f"is {bound!r}, not a number of seconds"
    )


def test_a_seed_fixes_the_draws() -> None:
    first = run(seed=1)
    assert run(seed=1) == first, broken("_hypothesis_internal_use_seed", "is not honoured: one seed drew two sequences")
    assert run(seed=2) != first, broken("_hypothesis_internal_use_seed", "is ignored: two seeds drew one sequence")


def test_the_digest_keys_the_database() -> None:
    def keys(name: str) -> set[bytes]:
        db = InMemoryExampleDatabase()
        run(seed=3, name=name, fail=True, database=db)
        return set(db.data)

    first = keys("DrawingA")
    assert first, "a failing run saved nothing in the example database"
    assert keys("DrawingA") == first, broken("_hypothesis_internal_add_digest", "no longer gives a stable key")
    assert keys("DrawingB").isdisjoint(first), broken(
        "_hypothesis_internal_add_digest", "is ignored: two machines share example-database keys"
    )


def test_the_shrinking_bound_is_honoured() -> None:
    saved = engine.MAX_SHRINKING_SECONDS
    assert run(seed=3, fail=True)[-1] == LIMIT, "with a minute to shrink, the failing draw shrinks to its bound"
    assert run(seed=3, fail=True, shrink_seconds=0)[-1] > LIMIT, broken(
        "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS", "is ignored: no time to shrink, yet it shrank"
    )
    assert run(seed=3, fail=True, cap=0)[-1] > LIMIT, broken(
        "hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS",
        "is read before the first failing example ends: a cap set then was ignored",
    )
    assert engine.MAX_SHRINKING_SECONDS == saved, "run_as_test left its shrinking bound behind"


def test_the_slow_shrinking_warning_is_hypothesis_and_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """Shrinking cut to 0 s makes Hypothesis report its 'five minutes ... PLEASE REPORT THIS' warning;
    ``run_as_test`` keeps it from the user, and nothing else."""
    from hypothesis.reporting import report, with_reporter

    heard: list[str] = []
    with with_reporter(lambda v: heard.append(str(v))):
        run(seed=3, fail=True, shrink_seconds=0)
        with without_slow_shrinking_warning():
            report(SLOW_SHRINKING_WARNING + " (a test)")
            report("another message")
    assert heard == ["another message"], heard
    capsys.readouterr()
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = 0  # the same run without run_as_test's filter: Hypothesis still warns
    try:
        cls = type("Bare", (Drawing,), {"drawn": [], "fail_at": LIMIT, "cap": None})
        hyp = settings(max_examples=10, stateful_step_count=5, deadline=None, database=None, print_blob=False)
        with with_reporter(lambda v: heard.append(str(v))), pytest.raises(AssertionError, match="drew"):
            cls._hypothesis_internal_use_seed = 3  # type: ignore[attr-defined]
            run_state_machine_as_test(cls, settings=hyp)
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
    assert any(h.startswith(SLOW_SHRINKING_WARNING) for h in heard), broken(
        "the slow-shrinking warning", f"no longer starts {SLOW_SHRINKING_WARNING!r}: the filter would miss it"
    )
