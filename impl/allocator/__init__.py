"""kvspec's fast KV-cache block allocator: vLLM 0.33 ``KVCacheManager`` semantics on flat arrays.

An independent re-implementation (it imports nothing from ``spec/``) of vLLM 0.33's
``BlockPool`` + ``FreeKVCacheBlockQueue`` + ``SingleTypeKVCacheManager`` subclasses +
coordinators + ``KVCacheManager``, written for speed:

- blocks are plain ints; ``ref_cnt``, the free-queue links and the primary hash key live in
  per-block lists, so the doubly linked free queue costs O(1) per remove/append/prepend and no
  operation scans the whole pool (``observe``-style dumps aside);
- block tables are ``list[int]`` (0 = the null block);
- the hash map is ``dict[key, list[int]]`` (insertion order; first = returned by lookups).

Free order: ``free_order="v0.33"`` puts blocks that reach ``ref_cnt == 0`` unhashed at the front
(in the given order) and hashed at the tail; ``"v0.20"`` appends them all (vLLM <= 0.20).

Out of scope (raise ``NotImplementedError``): EAGLE, partial (sub-block) hits and CoW, Mamba,
HiSparse, lookahead hashes, retention intervals, DCP/PCP.

Refused (raise ``Refused``, a ``ValueError``; ``impl.allocator.refusals``): the inputs on which vLLM
0.33 hands out a table that reads the null block, its known bugs K1-K3 (docs/upstream/).

The code lives in one module per vLLM layer; this module re-exports their public names:

- ``impl.allocator.events``: ``Stored``, ``Removed``, ``Cleared`` (the published KV events);
- ``impl.allocator.request``: ``Request``, ``GroupSpec`` and the request statuses;
- ``impl.allocator.block_pool``: ``BlockPool`` (free queue + hash map) and ``NULL``;
- ``impl.allocator.single_type_managers``: one manager per attention kind, ``MANAGER_CLASSES``,
  ``admission_cap``;
- ``impl.allocator.refusals``: ``Refused`` and the checks that raise it;
- ``impl.allocator.kv_cache_manager``: ``KVCacheManager`` (the coordinator folded in).

Imports: nothing.
"""

from __future__ import annotations

from kvspec.impl.allocator.block_pool import FREE_ORDERS, NULL, BlockPool
from kvspec.impl.allocator.events import Cleared, KVEvent, Removed, Stored
from kvspec.impl.allocator.kv_cache_manager import KVCacheManager
from kvspec.impl.allocator.refusals import Refused
from kvspec.impl.allocator.request import PREEMPTED, RUNNING, WAITING, WAITING_FOR_REMOTE_KVS, GroupSpec, Request
from kvspec.impl.allocator.single_type_managers import (
    MANAGER_CLASSES,
    ChunkedLocalManager,
    CrossAttentionManager,
    SingleTypeManager,
    SlidingWindowManager,
    admission_cap,
    cdiv,
)

__all__ = [
    "FREE_ORDERS",
    "MANAGER_CLASSES",
    "NULL",
    "PREEMPTED",
    "RUNNING",
    "WAITING",
    "WAITING_FOR_REMOTE_KVS",
    "BlockPool",
    "ChunkedLocalManager",
    "Cleared",
    "CrossAttentionManager",
    "GroupSpec",
    "KVCacheManager",
    "KVEvent",
    "Refused",
    "Removed",
    "Request",
    "SingleTypeManager",
    "SlidingWindowManager",
    "Stored",
    "admission_cap",
    "cdiv",
]
