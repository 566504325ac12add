"""Running a state machine as one Hypothesis test: kvspec's only use of Hypothesis' private parts.

Checked against Hypothesis 6.170.17 (``HYPOTHESIS_VERSION``, pinned in pyproject.toml and
ci/requirements.txt); tests/harness/test_hypothesis_internals.py fails, naming the attribute, when
a release moves one of them or changes what it does:

- ``MAX_SHRINKING_SECONDS`` of ``hypothesis.internal.conjecture.engine``: Hypothesis' bound on
  shrinking (300 s), a module constant with no setting, read once as shrinking starts;
- ``_hypothesis_internal_use_seed`` on a machine's factory: the seed of its draws (what ``@seed``
  sets; ``run_state_machine_as_test`` copies it from the factory);
- ``_hypothesis_internal_add_digest`` on the factory: bytes added to its example-database key, so
  that each machine class keeps its own past failures;
- ``hypothesis.reporting.with_reporter``: where the engine's messages go.  When shrinking stops at
  the bound, Hypothesis reports ``SLOW_SHRINKING_WARNING`` ("more than five minutes ... PLEASE
  REPORT THIS"), which is false once kvspec has cut the bound to seconds and asks users to file
  a Hypothesis bug kvspec caused: ``run_as_test`` drops that one message, every other one passes.

Both state machines run through here: the lockstep one (``harness.check.machine``) and the P/D one
(``harness.pd.machine``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hypothesis import settings
from hypothesis.internal.conjecture import engine
from hypothesis.reporting import current_reporter, with_reporter
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

HYPOTHESIS_VERSION = "6.170.17"
"""The Hypothesis release whose private attributes below were checked."""

SLOW_SHRINKING_WARNING = "WARNING: Hypothesis has spent more than five minutes working to shrink"
"""The start of the message Hypothesis reports when shrinking reaches ``MAX_SHRINKING_SECONDS``."""


@contextmanager
def without_slow_shrinking_warning() -> Iterator[None]:
    """Hypothesis' reports pass through, but ``SLOW_SHRINKING_WARNING``: kvspec bounds shrinking
    on purpose and says so itself (``kvspec fuzz`` prints the bound at the first finding)."""
    outer = current_reporter()

    def report(value: object) -> None:
        if not str(value).startswith(SLOW_SHRINKING_WARNING):
            outer(value)

    with with_reporter(report):
        yield


def run_as_test(
    factory: Callable[[], RuleBasedStateMachine],
    name: str,
    hyp_settings: settings,
    seed: int | None,
    shrink_seconds: int,
) -> None:
    """Run the machine ``factory`` builds as one Hypothesis test named ``name`` (also its
    example-database key), drawing from ``seed`` (None: Hypothesis picks), with shrinking bounded
    by ``shrink_seconds`` for the run; raises, after shrinking, what the failing example raised.

    Hypothesis keys the database by the factory's source text too (``function_digest``): each
    machine module keeps its own factory, unchanged, so the examples saved by earlier runs are found.
    """
    factory.__name__ = name
    factory._hypothesis_internal_add_digest = name.encode()  # type: ignore[attr-defined]
    if seed is not None:
        factory._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = shrink_seconds
    try:
        with without_slow_shrinking_warning():
            run_state_machine_as_test(factory, settings=hyp_settings)  # type: ignore[arg-type]  # a factory works too
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


def cap_shrinking(seconds: float | None) -> int:
    """Lower the running bound on shrinking to ``seconds`` (rounded up; None leaves it) and return
    the bound.  Hypothesis reads it as shrinking starts, right after the first failing example:
    a cap set while that example runs applies to its shrinking."""
    if seconds is not None:
        engine.MAX_SHRINKING_SECONDS = min(engine.MAX_SHRINKING_SECONDS, math.ceil(seconds))
    return engine.MAX_SHRINKING_SECONDS
