"""Distinct types for the quantities a KV-cache manager juggles.

Off-by-ones hide in plain ``int``: a block id, a count of tokens and a count of blocks are all
integers, and vLLM's bugs come from mixing them up (``cdiv(tokens, bs)`` vs ``tokens // bs``, a
block index used as a token offset).  ``NewType`` costs nothing at run time and lets ``mypy
--strict`` (run on ``spec/``) reject the mix-ups.  Conversions are explicit and named:
``BlockCount(cdiv(n, bs))`` says what the number is.
"""

from __future__ import annotations

from typing import NewType

BlockId = NewType("BlockId", int)
"""Index of a physical block in the pool, ``0 <= id < num_gpu_blocks``; id 0 is the null block."""

TokenCount = NewType("TokenCount", int)
"""A number of tokens (or a token position, which is the number of tokens before it)."""

BlockCount = NewType("BlockCount", int)
"""A number of blocks (or a block index, which is the number of blocks before it)."""

GroupId = NewType("GroupId", int)
"""Index of a KV-cache group in ``KVCacheConfig.kv_cache_groups``."""

RequestId = NewType("RequestId", str)

BlockHash = NewType("BlockHash", bytes)
"""vLLM >= 0.10 ``BlockHash``: the digest of ``(parent hash, block tokens, extra keys)``."""

BlockKey = NewType("BlockKey", bytes)
"""vLLM ``BlockHashWithGroupId``: ``block_hash ++ group_id.to_bytes(4, "big")``, the map key."""

NULL_BLOCK_ID = BlockId(0)
"""The pool pops block 0 at construction and uses it as the placeholder for skipped positions."""


# Block ids per KV-cache group, in group order: a lookup's hits, an allocation's new blocks.
GroupBlockIds = tuple[tuple[BlockId, ...], ...]


def make_block_key(block_hash: BlockHash, group_id: GroupId) -> BlockKey:
    """vLLM 0.33 ``make_block_hash_with_group_id``: the hash followed by the 4-byte big-endian group id."""
    return BlockKey(block_hash + group_id.to_bytes(4, "big"))


def get_block_hash(key: BlockKey) -> BlockHash:
    """vLLM 0.33 ``get_block_hash``: strip the group id from a map key."""
    return BlockHash(key[:-4])


def get_group_id(key: BlockKey) -> GroupId:
    """vLLM 0.33 ``get_group_id``: the group id stored in the last 4 bytes of a map key."""
    return GroupId(int.from_bytes(key[-4:], "big"))
