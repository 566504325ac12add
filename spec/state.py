"""The manager's state: one block pool shared by every group, and each group's bookkeeping.

Models the data vLLM 0.33.0 keeps in ``KVCacheManager`` / ``KVCacheCoordinator`` /
``SingleTypeKVCacheManager``: per group, ``req_to_blocks`` (the block table of each request,
index i covering tokens ``[i*bs, (i+1)*bs)``, null placeholders at skipped positions) and
``num_cached_block`` (how many leading table positions have been through ``cache_blocks``;
membership means "admitted" to the manager).  The state is a value: mappings are never mutated
in place, updates build new ones (``with_group``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvspec.spec.block_pool import BlockPool, init_block_pool
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.types import BlockId, GroupId, RequestId


@dataclass(frozen=True, slots=True)
class GroupState:
    req_to_blocks: Mapping[RequestId, tuple[BlockId, ...]]
    num_cached_block: Mapping[RequestId, int]


@dataclass(frozen=True, slots=True)
class KVCacheManagerState:
    config: KVCacheConfig
    pool: BlockPool
    groups: tuple[GroupState, ...]


def init_state(config: KVCacheConfig, persistent: bool | None = None) -> KVCacheManagerState:
    """A fresh state; ``persistent`` chooses the pool's representation (``init_block_pool``)."""
    config.validate()
    pool = init_block_pool(
        config.num_blocks, config.enable_caching, config.profile, config.enable_kv_cache_events, persistent
    )
    return KVCacheManagerState(config, pool, tuple(GroupState({}, {}) for _ in config.groups))


def get_table(state: KVCacheManagerState, gid: GroupId, request_id: RequestId) -> tuple[BlockId, ...]:
    return state.groups[gid].req_to_blocks.get(request_id, ())


def with_table(
    state: KVCacheManagerState, gid: GroupId, request_id: RequestId, table: tuple[BlockId, ...]
) -> KVCacheManagerState:
    group = state.groups[gid]
    tables = dict(group.req_to_blocks)
    tables[request_id] = table
    return with_group(state, gid, replace(group, req_to_blocks=tables))


def with_num_cached_block(
    state: KVCacheManagerState, gid: GroupId, request_id: RequestId, n: int
) -> KVCacheManagerState:
    group = state.groups[gid]
    cached = dict(group.num_cached_block)
    cached[request_id] = n
    return with_group(state, gid, replace(group, num_cached_block=cached))


def without_request(state: KVCacheManagerState, gid: GroupId, request_id: RequestId) -> KVCacheManagerState:
    group = state.groups[gid]
    if request_id not in group.req_to_blocks and request_id not in group.num_cached_block:
        return state
    tables = {r: t for r, t in group.req_to_blocks.items() if r != request_id}
    cached = {r: n for r, n in group.num_cached_block.items() if r != request_id}
    return with_group(state, gid, GroupState(tables, cached))


def with_group(state: KVCacheManagerState, gid: GroupId, group: GroupState) -> KVCacheManagerState:
    return replace(state, groups=state.groups[:gid] + (group,) + state.groups[gid + 1 :])


def with_pool(state: KVCacheManagerState, pool: BlockPool) -> KVCacheManagerState:
    return replace(state, pool=pool)
