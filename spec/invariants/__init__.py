"""Every invariant of the manager as a named predicate, in one registry.

Each predicate cites its rule in docs/semantics.md ("§9.n" for the numbered invariants, "P1".."P7"
for the operation postconditions, both in §9) and returns ``None`` when it holds or a message
naming the witness when it does not.  Two kinds:

- **state** predicates (``state_invariants``) look at one state (plus the requests, whose hashes
  the tables must match);
- **step** predicates (``step_invariants``) look at one operation: the state before and after, the
  call and its outcome.

``check_invariants`` and ``check_step`` run every predicate of a kind and return the violations,
each carrying the predicate's name, so the harness can stop with ``"§9.5 ref_count_equals_references:
block 7 has ref_cnt 2 but 1 reference"``.  The registry itself (``SPEC_INVARIANTS``, in ``registry``) is
filled by importing the predicate modules below, state first (vLLM's and the engine-neutral ones,
then SGLang's policy, ``state_sglang``), then step: that order is the report order.  A predicate
tagged ``VLLM_POLICY`` or ``SGLANG_POLICY`` states one engine's policy and is checked only on a
target of that engine; the others are engine-neutral (``check_invariants(engine=...)``).
``docs/invariants.md`` is the registry as a table (``render_invariant_table``).  ``memo`` keeps what two
state predicates would otherwise redo at every check (hash recomputations, the event replay).

Imports: spec, spec.releases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvspec.spec.block_pool import thaw
from kvspec.spec.events import Event
from kvspec.spec.invariants import (  # noqa: F401  (registers them, in this order: the report order)
    state_invariants,
    state_sglang,
    step_invariants,
)
from kvspec.spec.invariants.registry import (
    SGLANG_POLICY,
    SPEC_INVARIANTS,
    VLLM_POLICY,
    InvariantKind,
    StateContext,
    StepContext,
    Violation,
    run_invariants,
)
from kvspec.spec.invariants.table import render_invariant_table
from kvspec.spec.registry import Invariant
from kvspec.spec.request import Request
from kvspec.spec.state import KVCacheManagerState, with_pool
from kvspec.spec.types import RequestId

__all__ = [
    "SGLANG_POLICY",
    "SPEC_INVARIANTS",
    "VLLM_POLICY",
    "Invariant",
    "InvariantKind",
    "StateContext",
    "StepContext",
    "Violation",
    "check_invariants",
    "check_step",
    "render_invariant_table",
]


def check_invariants(
    state: KVCacheManagerState,
    requests: Mapping[RequestId, Request],
    *,
    evict_called: bool = False,
    event_log: Sequence[Event] | None = None,
    names: Sequence[str] | None = None,
    engine: str | None = None,
    facts: Mapping[str, Any] | None = None,
) -> list[Violation]:
    """Run every state invariant (or the named ones; with ``engine``, only the engine-neutral ones and
    that engine's policy, reading its ``facts``); return each violation with its name.  A
    persistent pool is read out into tuples once first (``spec.block_pool.thaw``)."""
    if (pool := thaw(state.pool)) is not state.pool:
        state = with_pool(state, pool)
    ctx = StateContext(state, requests, evict_called, event_log, dict(facts or {}))
    return run_invariants(ctx, "state", names, engine)


def check_step(ctx: StepContext, names: Sequence[str] | None = None) -> list[Violation]:
    """Run every step postcondition (or the named ones) on one operation."""
    return run_invariants(ctx, "step", names)
