"""kvspec's own fast allocator (``impl.allocator``) as a harness target.

The adapter keeps the scheduler-side request objects (tokens, drafts, ``num_computed_tokens``,
status, block hashes and the LoRA / multimodal / salt features they are hashed with), translates
each ``harness.ops`` operation into a call on ``impl.allocator.KVCacheManager``, and reports the
manager's state as an ``Observation``.  It shares only vocabulary with ``spec/`` (config, events,
types); the allocator itself is independent of it.
"""

from __future__ import annotations

from typing import Any

from harness.observation import Observation, event_to_json
from harness.ops import (
    AddRequest,
    AllocateSlots,
    AppendOutputTokens,
    CacheBlocks,
    EvictBlocks,
    Free,
    GetComputedBlocks,
    Op,
    RemoveSkippedBlocks,
    ResetPrefixCache,
    SetNumComputedTokens,
    SetSpecTokens,
    SetStatus,
    TakeEvents,
)
from harness.targets.base import Unsupported
from impl import allocator as alloc
from impl.hashing import BlockHasher
from spec.config import KVCacheConfig, Profile
from spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from spec.types import BlockHash, GroupId, TokenCount

_FREE_ORDER = {Profile.V0_33: "v0.33", Profile.V0_20: "v0.20"}


class _Req:
    """Scheduler-side request state plus the allocator's view of it."""

    __slots__ = ("core", "lora", "mm", "salt", "drafts")

    def __init__(self, op: AddRequest) -> None:
        self.core = alloc.Request(
            request_id=op.request_id,
            all_token_ids=list(op.prompt_token_ids),
            num_prompt_tokens=len(op.prompt_token_ids),
            skip_reading_prefix_cache=op.skip_reading_prefix_cache,
        )
        self.lora = op.lora
        self.mm = tuple((m.identifier, m.offset, m.length) for m in op.mm_features)
        self.salt = op.cache_salt
        self.drafts: tuple[int, ...] = ()


class ImplTarget:
    """``impl.allocator.KVCacheManager`` driven through the kvspec ``Target`` protocol."""

    name = "impl"

    def __init__(self) -> None:
        self._manager: alloc.KVCacheManager | None = None
        self._requests: dict[str, _Req] = {}
        self._computed: dict[str, tuple[list[int], ...]] = {}

    @property
    def version(self) -> str:
        return "kvspec impl (vLLM 0.33 semantics)"

    def reset(self, config: KVCacheConfig) -> None:
        """Build a fresh allocator for ``config``."""
        config.validate()
        groups = [
            alloc.GroupSpec(g.kind, g.block_size, g.sliding_window, g.attention_chunk_size) for g in config.groups
        ]
        self._manager = alloc.KVCacheManager(
            groups,
            num_blocks=config.num_blocks,
            max_model_len=config.max_model_len,
            enable_caching=config.enable_caching,
            hash_block_size=config.hash_block_size,
            enable_events=config.enable_kv_cache_events,
            watermark=config.watermark,
            max_in_flight_tokens=config.max_in_flight_tokens,
            free_order=_FREE_ORDER[config.profile],
        )
        # vLLM 0.33 EngineCore builds the block hasher only when prefix caching is on (no connector
        # is modelled): with caching off, requests carry no block hashes.
        self._hasher = BlockHasher(config.hash_block_size, config.hash_algo) if config.enable_caching else None
        self._requests = {}
        self._computed = {}

    # -- apply --

    def apply(self, op: Op) -> Any:
        if self._manager is None:
            raise ValueError("ImplTarget.apply called before reset(config)")
        handler = _HANDLERS.get(type(op))
        if handler is None:
            raise Unsupported(f"operation {type(op).__name__} is not modelled by the impl target")
        try:
            return handler(self, op)
        except NotImplementedError as e:
            raise Unsupported(str(e)) from e

    def _req(self, rid: str) -> _Req:
        try:
            return self._requests[rid]
        except KeyError:
            raise ValueError(f"unknown request {rid!r} (no add_request before it)") from None

    def _rehash(self, r: _Req) -> None:
        if self._hasher is not None:
            self._hasher.extend(r.core.block_hashes, r.core.all_token_ids, r.lora, r.mm, r.salt)

    def _add_request(self, op: AddRequest) -> None:
        if op.request_id in self._requests:
            raise ValueError(f"request {op.request_id!r} already exists")
        r = _Req(op)
        self._rehash(r)
        self._requests[op.request_id] = r

    def _append_output_tokens(self, op: AppendOutputTokens) -> None:
        r = self._req(op.request_id)
        r.core.all_token_ids.extend(op.token_ids)
        self._rehash(r)

    def _set_spec_tokens(self, op: SetSpecTokens) -> None:
        self._req(op.request_id).drafts = tuple(op.token_ids)

    def _set_num_computed_tokens(self, op: SetNumComputedTokens) -> None:
        self._req(op.request_id).core.num_computed_tokens = op.num_computed_tokens

    def _set_status(self, op: SetStatus) -> None:
        self._req(op.request_id).core.status = op.status

    def _get_computed_blocks(self, op: GetComputedBlocks) -> dict[str, Any]:
        assert self._manager is not None
        lists, hit = self._manager.get_computed_blocks(self._req(op.request_id).core)
        self._computed[op.request_id] = lists
        return {"block_ids": [list(x) for x in lists], "num_hit_tokens": hit}

    def _allocate_slots(self, op: AllocateSlots) -> dict[str, Any] | None:
        assert self._manager is not None
        r = self._req(op.request_id)
        computed = op.take_computed_blocks(self._computed)
        new = self._manager.allocate_slots(r.core, op.num_new_tokens, **op.manager_kwargs(computed))
        return None if new is None else {"block_ids": [list(x) for x in new]}

    def _free(self, op: Free) -> None:
        assert self._manager is not None
        self._req(op.request_id)
        self._manager.free(op.request_id)
        self._computed.pop(op.request_id, None)

    def _cache_blocks(self, op: CacheBlocks) -> None:
        assert self._manager is not None
        self._manager.cache_blocks(self._req(op.request_id).core, op.num_computed_tokens)

    def _remove_skipped_blocks(self, op: RemoveSkippedBlocks) -> None:
        assert self._manager is not None
        self._manager.remove_skipped_blocks(op.request_id, op.num_computed_tokens)

    def _evict_blocks(self, op: EvictBlocks) -> None:
        assert self._manager is not None
        self._manager.evict_blocks(set(op.block_ids))

    def _reset_prefix_cache(self, op: ResetPrefixCache) -> bool:
        assert self._manager is not None
        return self._manager.reset_prefix_cache()

    def _take_events(self, op: TakeEvents) -> list[dict[str, Any]]:
        assert self._manager is not None
        return [event_to_json(_to_spec_event(e)) for e in self._manager.take_events()]

    # -- observe --

    def observe(self) -> Observation:
        """The allocator's state in the spec's vocabulary (the one reader of its internals)."""
        m = self._manager
        if m is None:
            raise ValueError("ImplTarget.observe called before reset(config)")
        pool = m.pool
        return Observation(
            # Like vLLM's defaultdict, a lookup of an unknown id leaves an empty table; it is reported.
            tables=tuple({rid: tuple(t) for rid, t in g.tables.items()} for g in m.managers),
            num_cached_block=tuple(dict(g.num_cached) for g in m.managers),
            ref_cnt=(0, *pool.ref[1:]),
            free_queue=tuple(pool.free_queue()),
            block_key=tuple(pool.key),
            cached={k: tuple(ids) for k, ids in pool.cached.items()},
            request_block_hashes={rid: tuple(r.core.block_hashes) for rid, r in self._requests.items()},
            block_key_tokens=tuple(None if k is None else n for k, n in zip(pool.key, pool.key_tokens)),
            secondary_keys={b: frozenset(keys) for b, keys in pool.secondary.items() if keys},
        )


def _to_spec_event(e: alloc.Stored | alloc.Removed | alloc.Cleared) -> Event:
    if isinstance(e, alloc.Stored):
        return BlockStored(
            block_hashes=tuple(BlockHash(h) for h in e.block_hashes),
            parent_block_hash=None if e.parent_block_hash is None else BlockHash(e.parent_block_hash),
            token_ids=e.token_ids,
            block_size=TokenCount(e.block_size),
            group_id=GroupId(e.group_id),
        )
    if isinstance(e, alloc.Removed):
        return BlockRemoved(block_hashes=tuple(BlockHash(h) for h in e.block_hashes), group_id=GroupId(e.group_id))
    return AllBlocksCleared()


_HANDLERS = {
    AddRequest: ImplTarget._add_request,
    AppendOutputTokens: ImplTarget._append_output_tokens,
    SetSpecTokens: ImplTarget._set_spec_tokens,
    SetNumComputedTokens: ImplTarget._set_num_computed_tokens,
    SetStatus: ImplTarget._set_status,
    GetComputedBlocks: ImplTarget._get_computed_blocks,
    AllocateSlots: ImplTarget._allocate_slots,
    Free: ImplTarget._free,
    CacheBlocks: ImplTarget._cache_blocks,
    RemoveSkippedBlocks: ImplTarget._remove_skipped_blocks,
    EvictBlocks: ImplTarget._evict_blocks,
    ResetPrefixCache: ImplTarget._reset_prefix_cache,
    TakeEvents: ImplTarget._take_events,
}
