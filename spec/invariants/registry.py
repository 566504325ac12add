"""The registry of the manager's invariants (``SPEC_INVARIANTS``), and the contexts its predicates read.

A predicate is registered with ``@SPEC_INVARIANTS.register(rule, kind)`` (a ``spec.registry``):
``rule`` names what it checks in ``docs/semantics.md`` ("§9.n" for the numbered invariants,
"P1".."P7" for the operation postconditions), ``kind`` (``state`` or ``step``) says what it reads,
``engines`` (``VLLM_POLICY``, ``SGLANG_POLICY``) marks a rule of one engine's policy; the rest are
engine-neutral and hold for any correct KV cache (docs/invariants.md says which is which).
Registration order is the order in which ``spec.invariants`` reports violations.  The predicates
live in ``spec.invariants.state_invariants`` and ``spec.invariants.step_invariants``; importing
``spec.invariants`` registers both, in that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import Event
from kvspec.spec.hashing import get_group_block_hashes
from kvspec.spec.registry import Registry
from kvspec.spec.request import Request
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import NULL_BLOCK_ID, BlockHash, BlockId, GroupId, RequestId

InvariantKind = Literal["state", "step"]
VLLM_POLICY = ("vllm",)
"""vLLM's policy: lazy eviction (an unreferenced block is free and keeps its key), its free order, its
event stream, and every operation postcondition (they describe vLLM's manager calls)."""
SGLANG_POLICY = ("sglang",)
"""SGLang's radix cache: its own tree and pool checks, read from the target's engine facts."""
Slot = tuple[GroupId, RequestId, int]
"""One table slot: (group, request, index)."""

# --- contexts ------------------------------------------------------------------------------------


@dataclass
class StateContext:
    """One state to check.  ``evict_called``: ``evict_blocks`` ran at some point (it legitimately
    strips hashes from blocks still in use, which relaxes docs/semantics.md §9.8, §9.10 and §9.16).
    ``event_log``: every event taken so far (``None`` when the caller does not track them), for
    §9.20.  ``facts``: what an engine reports beyond the spec's vocabulary (``Observation.facts``),
    for that engine's policy predicates."""

    state: KVCacheManagerState
    requests: Mapping[RequestId, Request]
    evict_called: bool = False
    event_log: Sequence[Event] | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)
    _references: dict[BlockId, list[Slot]] | None = field(default=None, init=False, repr=False)
    _free_set: set[BlockId] | None = field(default=None, init=False, repr=False)

    @property
    def config(self) -> KVCacheConfig:
        return self.state.config

    @property
    def references(self) -> dict[BlockId, list[Slot]]:
        """Non-null block -> every table slot (group, request, index) that holds it (read once; a plain
        attribute, as ``functools.cached_property`` takes a lock on every first read before Python 3.12)."""
        if self._references is None:
            self._references = self._read_references()
        return self._references

    @property
    def free_set(self) -> set[BlockId]:
        if self._free_set is None:
            self._free_set = set(self.state.pool.free_queue)
        return self._free_set

    def _read_references(self) -> dict[BlockId, list[Slot]]:
        refs: dict[BlockId, list[Slot]] = {}
        for gid, group in enumerate(self.state.groups):
            for rid, table in group.req_to_blocks.items():
                for i, b in enumerate(table):
                    if b != NULL_BLOCK_ID:
                        refs.setdefault(b, []).append((GroupId(gid), rid, i))
        return refs

    def view_hashes(self, rid: RequestId, gid: int) -> Sequence[BlockHash]:
        """``H_g(r)``: the request's hashes as group g keys its blocks (the last fine hash of each;
        before vLLM 0.24 all of them concatenated: ``spec.hashing.get_group_block_hashes``)."""
        hashes = self.requests[rid].block_hashes
        bs, hbs = self.config.groups[gid].block_size, self.config.hash_block_size
        return get_group_block_hashes(hashes, hbs, bs, self.config.profile)


@dataclass
class StepContext:
    """One manager operation: ``op`` is the operation's name in ``spec.kv_cache_manager``
    (``get_computed_blocks``, ``allocate_slots``, ``free``, ``cache_blocks``,
    ``remove_skipped_blocks``, ``evict_blocks``, ``reset_prefix_cache``, ``take_events``), ``args``
    its keyword arguments, ``request`` the request passed (if any)."""

    before: KVCacheManagerState
    after: KVCacheManagerState
    op: str
    args: Mapping[str, Any]
    outcome: Any
    request: Request | None = None
    evict_called: bool = False


@dataclass(frozen=True)
class Violation:
    name: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule} {self.name}: {self.message}"


SPEC_INVARIANTS: Registry[Any, str] = Registry("spec invariant", get_args(InvariantKind))
"""Every invariant of the manager; a state predicate reads a ``StateContext``, a step one a ``StepContext``."""


def run_invariants(
    ctx: Any, kind: InvariantKind, names: Sequence[str] | None = None, engine: str | None = None
) -> list[Violation]:
    """Run every registered predicate of ``kind`` (or the named ones; those in force for ``engine``,
    all when None), in registration order."""
    found = SPEC_INVARIANTS.check(ctx, names, (kind,), engine)
    return [Violation(inv.name, inv.rule, message) for inv, message in found]
