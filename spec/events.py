"""KV-cache events (vLLM 0.33 ``vllm.distributed.kv_events``), reduced to what the manager decides.

vLLM's event objects also carry a medium, LoRA metadata and the group's spec kind; kvspec keeps the
fields the allocation semantics fix: which hashes were stored or removed, under which parent, for
which tokens and group.  Hashes are the raw ``BlockHash`` bytes (the group id is carried apart).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.spec.types import BlockHash, GroupId, TokenCount


@dataclass(frozen=True, slots=True)
class BlockStored:
    """vLLM 0.33 ``BlockStored``: one per ``cache_full_blocks`` call that advanced the cached count
    (``block_hashes`` lists the blocks actually published and may be empty when every newly full
    slot was a null or masked block), and one per new partial entry (``block_size`` is then the
    hash block size)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: TokenCount
    group_id: GroupId


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """One key removed from the hash map (vLLM 0.33 ``BlockRemoved``, one per key)."""

    block_hashes: tuple[BlockHash, ...]
    group_id: GroupId


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """A successful ``reset_prefix_cache`` (vLLM 0.33 ``AllBlocksCleared``)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared
