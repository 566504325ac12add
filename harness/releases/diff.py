"""``kvspec releases diff OLD NEW``: what an upgrade from one vLLM release to another changes.

Both sides are the spec: the reference runs under OLD's profile (the config a family draws is bound
to OLD: ``harness.targets.base.bind_release``), the target under NEW's (``ReleasePairTarget``).  The
fuzz loop (``harness.run.fuzzing.run_fuzz``) drives them with the same seeded workloads under the
exact relation, so the first step where NEW behaves otherwise is a finding, shrunk and reduced as
any other.  Each finding is then attributed: replayed with one of the changed knobs set back to
OLD's value at a time, the knob whose reverting makes the divergence go away is the change met.
That knob stays reverted for the rest of the run, so the next finding is a different change; a
divergence no single knob explains ends the run as ``unattributed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.releases.line import changes_between, profile_for
from kvspec.spec.releases.profile import Change, Profile


class ReleasePairTarget(SpecTarget):
    """The spec under ``new`` (with the knobs in ``reverted`` at ``old``'s values), standing in for a
    target that models ``old``: its ``profile`` binds the run's configs, and so the reference, to
    ``old`` while it computes ``new``."""

    def __init__(self, old: Profile, new: Profile, reverted: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.profile = old
        back = {k: old.knobs()[k] for k in reverted}
        self.computes = new.with_knobs(new.name, new.release, new.changes, **back)

    @property
    def version(self) -> str:
        return f"kvspec spec under {self.computes.name} (reference {self.profile.name})"

    def reset(self, config: KVCacheConfig) -> None:
        super().reset(replace(config, profile=self.computes) if config.profile == self.profile else config)


@dataclass
class Met:
    """One behaviour change met: the knob, the ``Change`` records behind it, the reduced trace."""

    knob: str
    changes: tuple[Change, ...]
    trace: dict[str, Any]
    summary: str
    found_after: float

    @property
    def finding(self) -> dict[str, Any]:
        return dict(self.trace.get("finding") or {})


@dataclass
class DiffResult:
    old: str
    new: str
    met: list[Met] = field(default_factory=list)
    unattributed: dict[str, Any] | None = None  # a trace no single knob explains
    examples: int = 0
    steps: int = 0
    elapsed: float = 0.0
    knobs: tuple[str, ...] = ()  # the knobs that differ between the two releases

    @property
    def changed(self) -> bool:
        return bool(self.met) or self.unattributed is not None


def changed_knobs(old: Profile, new: Profile) -> tuple[str, ...]:
    a, b = old.knobs(), new.knobs()
    return tuple(k for k in a if a[k] != b[k])


def diff_releases(
    old: str,
    new: str,
    run: Callable[[Callable[[], Any], float], Any],
    replay_ok: Callable[[dict[str, Any], Callable[[], Any]], bool],
    seconds: float,
    on_met: Callable[[Met], None] | None = None,
) -> DiffResult:
    """Fuzz ``old`` against ``new`` for ``seconds`` (``run(factory, seconds_left)`` is one bounded fuzz
    run returning a ``FuzzResult``; ``replay_ok(trace, factory)``: the trace replays without a finding)."""
    p_old, p_new = profile_for(old), profile_for(new)
    res = DiffResult(old, new, knobs=changed_knobs(p_old, p_new))
    reverted: frozenset[str] = frozenset()
    start = time.monotonic()
    while True:
        left = seconds - (time.monotonic() - start)
        if left <= 0.5 or (res.knobs and set(res.knobs) <= reverted):
            break  # out of time, or every modelled change met (equal profiles still run the workloads)
        fuzz = run(_factory(p_old, p_new, reverted), left)
        res.examples, res.steps = res.examples + fuzz.examples, res.steps + fuzz.steps
        if fuzz.trace is None:
            break  # the time ran out with no further change met
        untried = [k for k in res.knobs if k not in reverted]
        knob = next((k for k in untried if replay_ok(fuzz.trace, _factory(p_old, p_new, reverted | {k}))), None)
        if knob is None:
            res.unattributed = fuzz.trace
            break
        met = Met(knob, _changes_of(knob, old, new), fuzz.trace, fuzz.summary or "", time.monotonic() - start)
        res.met.append(met)
        if on_met is not None:
            on_met(met)
        reverted |= {knob}
    res.elapsed = time.monotonic() - start
    return res


def _factory(old: Profile, new: Profile, reverted: frozenset[str]) -> Callable[[], ReleasePairTarget]:
    return lambda: ReleasePairTarget(old, new, reverted)


def _changes_of(knob: str, old: str, new: str) -> tuple[Change, ...]:
    return tuple(c for c in changes_between(old, new) if c.knob == knob)
