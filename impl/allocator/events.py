"""The KV-cache events kvspec's allocator publishes (vLLM 0.33 ``vllm.distributed.kv_events``).

Only what the manager decides is kept: which keys were stored or removed, in which group, and for a
store the parent hash and the tokens the blocks cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(slots=True)
class Stored:
    """vLLM 0.33 ``BlockStored`` reduced to what the manager decides."""

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    group_id: int


@dataclass(slots=True)
class Removed:
    """vLLM 0.33 ``BlockRemoved`` (one per removed key)."""

    block_hashes: tuple[bytes, ...]
    group_id: int


@dataclass(slots=True)
class Cleared:
    """vLLM 0.33 ``AllBlocksCleared``."""


KVEvent: TypeAlias = Stored | Removed | Cleared
