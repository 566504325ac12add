"""Scripted schedules: the shortest counterexamples, replayable in milliseconds.

Each ``Scenario`` is a list of world actions (the state machine's rules, with messages picked by
kind and request rather than by position).  ``SCENARIOS`` holds one per deliberate bug (and the
proposal as written): under the bug the schedule breaks the named rule; under the safe design it
was derived from, the very same schedule breaks nothing.  ``kvspec pd check --scenarios`` and
tests/pd replay them; docs/pd-preallocation.md prints them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.harness.pd import cluster, prefill, router
from kvspec.harness.pd.designs import BUGS
from kvspec.harness.pd.instance import make_config
from kvspec.harness.pd.invariants import PDViolation, check_pd_invariants
from kvspec.harness.pd.machine import clear_logs
from kvspec.harness.pd.state import ClusterState
from kvspec.harness.pd.types import Design, Options, Timing
from kvspec.spec.types import RequestId

Action = tuple[Any, ...]
R0 = (1, 2, 3, 1, 2, 3, 1, 2)  # two blocks of 4


@dataclass(frozen=True)
class Scenario:
    name: str
    design: Design  # the design that breaks
    safe: Design  # the design the same schedule must leave unbroken
    invariant: str
    actions: tuple[Action, ...]
    options: Options = field(default_factory=Options)


def _find(s: ClusterState, kind: str, rid: str | None) -> int | None:
    for k, env in enumerate(s.network):
        if type(env.msg).__name__ == kind and (rid is None or getattr(env.msg, "rid", None) == rid):
            return k
    return None


def apply_action(s: ClusterState, a: Action) -> ClusterState:
    """One scripted action (``drain`` is ``play``'s); delivering a message that is not in flight
    does nothing."""
    op = a[0]
    if op == "submit":
        return router.submit(s, RequestId(a[1]), tuple(a[2]), a[3])
    if op == "deliver":
        k = _find(s, a[1], a[2] if len(a) > 2 else None)
        return s if k is None else cluster.deliver(s, k)
    if op == "tick":
        return cluster.tick(s)
    if op == "p_step":
        return prefill.p_step(s)
    if op == "d_step":
        return cluster.step_decoder(s, a[1] if len(a) > 1 else 0)
    if op == "abort":
        return router.abort(s, RequestId(a[1]))
    if op == "fail_prefill":
        return cluster.fail_prefill(s)
    raise ValueError(f"unknown scripted action {a!r}")


def play(
    design: Design,
    actions: Sequence[Action],
    options: Options | None = None,
    names: Sequence[str] | None = None,
    judge: Callable[[ClusterState], str | None] | None = None,
) -> tuple[ClusterState, PDViolation | None]:
    """Run ``actions`` (then ``drain``), checking the rules (or ``names``) after every transition;
    stop at the first violation.  ``judge`` (a mirror's ``replay``) sees every state first."""
    options = options or Options()
    s = cluster.init_cluster(design, options, make_config(8, 4, 64), make_config(8, 4, 64))

    class Stop(Exception):
        pass

    found: list[PDViolation] = []

    def check(x: ClusterState, idle: bool = False) -> ClusterState:
        problem = judge(x) if judge is not None else None
        v = [PDViolation("vllm_agrees_with_spec", problem)] if problem else check_pd_invariants(x, names, idle=idle)
        if v:
            found.append(v[0])
            raise Stop
        return cluster.begin_step(clear_logs(x))

    try:
        s = check(s)
        for a in actions:
            s = cluster.drain(s, check) if a[0] == "drain" else check(apply_action(cluster.begin_step(s), a))
        s = cluster.drain(s, check)
        check(s, idle=True)
    except Stop:
        return s, found[0]
    return s, None


def _push_until_writes() -> tuple[Action, ...]:
    return (
        ("submit", "r0", R0, 1),
        ("deliver", "Prefill", "r0"),
        ("deliver", "Reserve", "r0"),
        ("p_step",),
        ("p_step",),
        ("deliver", "Reserved", "r0"),
        ("deliver", "Target", "r0"),
    )


RELEASE_ON_CANCEL = _push_until_writes() + (
    ("abort", "r0"),
    ("deliver", "Cancel", "r0"),
    ("deliver", "Write", "r0"),
)
"""The shortest counterexample to freeing a reservation on cancel: the abort's Cancel reaches D,
which frees the reservation, before P's write, already on the wire, lands."""

SHORT_LEASE = Options(timing=Timing(lease=3))
LATE_TARGET = (
    ("submit", "r0", R0, 1),
    ("tick",),
    ("deliver", "Prefill", "r0"),
    ("deliver", "Reserve", "r0"),
    ("tick",),
    ("tick",),
    ("deliver", "Reserved", "r0"),
    ("tick",),  # D's lease ends: D revokes while the Target is still on its way to P
    ("deliver", "Revoke", "r0"),
    ("deliver", "RevokeAck", "r0"),
    ("deliver", "Target", "r0"),
    ("p_step",),
    ("p_step",),
    ("deliver", "Write", "r0"),
)

_BY_BUG: dict[str, tuple[tuple[Action, ...], Options]] = {
    "release-on-cancel": (RELEASE_ON_CANCEL, Options()),
    "no-revoke-tombstone": (LATE_TARGET, SHORT_LEASE),
    "write-d-hits": ((("submit", "r0", R0, 1), ("drain",), ("submit", "r1", R0 + (3,), 1)), Options()),
    "producer-frees-at-finish": ((("submit", "r0", R0, 1),), Options()),
    "done-before-completions": (_push_until_writes() + (("deliver", "Done", "r0"), ("d_step",)), Options()),
    "schedule-before-arrival": ((("submit", "r0", R0, 1), ("deliver", "Reserve", "r0"), ("d_step",)), Options()),
    "no-cancel-on-abort": ((("submit", "r0", R0, 1), ("abort", "r0")), Options()),
    "forget-free": ((("submit", "r0", R0, 1), ("abort", "r0")), Options()),
    "no-fence": (_push_until_writes() + (("abort", "r0"), ("deliver", "Cancel", "r0"), ("fail_prefill",)), Options()),
}

SCENARIOS: dict[str, Scenario] = {
    f"bug:{name}": Scenario(f"bug:{name}", BUGS[name].design, BUGS[name].base, BUGS[name].invariant, actions, options)
    for name, (actions, options) in _BY_BUG.items()
}


def describe(actions: Sequence[Action]) -> list[str]:
    return [f"{a[0]}(" + ", ".join(str(list(x) if isinstance(x, tuple) else x) for x in a[1:]) + ")" for a in actions]
