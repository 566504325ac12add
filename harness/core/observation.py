"""What the harness sees of a target, in the spec's vocabulary.

Each target has exactly one function that builds an ``Observation`` from its own state (its
adapter's ``observe``); nothing else in kvspec reads a target's internals.  Block ids are ints,
hashes are ``bytes`` (``BlockHashWithGroupId`` form for map keys), requests are keyed by id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event


@dataclass(frozen=True, slots=True)
class Observation:
    """The per-block fields read like tuples: the spec of a large pool hands over its persistent
    containers (``spec.persistent``, O(1) to observe), other targets tuples."""

    # per group: request id -> block ids of its table (0 = null placeholder)
    tables: tuple[dict[str, tuple[int, ...]], ...]
    # per group: request id -> num_cached_block (absent = never cached)
    num_cached_block: tuple[dict[str, int], ...]
    # per block id: ref count (index 0, the null block, is reported as 0: its count is not maintained)
    ref_cnt: Sequence[int]
    # block ids in the free queue, front (evicted first) to tail
    free_queue: Sequence[int]
    # per block id: its primary map key (hash ++ group id), or None
    block_key: Sequence[bytes | None]
    # map key -> block ids stored under it, in insertion order (first = returned by lookups)
    cached: Mapping[bytes, tuple[int, ...]]
    # request id -> its block hashes (BlockHash bytes, no group id)
    request_block_hashes: dict[str, tuple[bytes, ...]]
    # per block id: how many prefix tokens its primary key covers (vLLM block_hash_num_tokens), or None
    block_key_tokens: Sequence[int | None] = ()
    # block id -> further keys stored for it (vLLM cached_block_hashes_by_block: partial tail entries);
    # a set, since vLLM keeps a set
    secondary_keys: dict[int, frozenset[bytes]] = field(default_factory=dict)
    # what an engine reports beyond this vocabulary, JSON values, read by its policy invariants
    # (``spec.invariants.state_sglang``); empty for vLLM and the managers that model it
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        return len(self.ref_cnt)


def event_to_json(e: Event) -> dict[str, Any]:
    if isinstance(e, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [h.hex() for h in e.block_hashes],
            "parent_block_hash": None if e.parent_block_hash is None else e.parent_block_hash.hex(),
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "group_id": e.group_id,
        }
    if isinstance(e, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": [h.hex() for h in e.block_hashes], "group_id": e.group_id}
    if isinstance(e, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not an event: {e!r}")
