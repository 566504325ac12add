"""kvspec's own fast allocator (``impl.allocator``) as a harness target.

The shared dispatch (``harness.targets.adapter``) keeps the request book; this adapter keeps the
allocator's own request records in step (tokens, ``num_computed_tokens``, status, and the block
hashes computed with the LoRA / multimodal / salt features of the book), maps each manager call
onto ``impl.allocator.KVCacheManager``, and reports the manager's state as an ``Observation``.  It
shares only vocabulary with ``spec/`` (config, events, types); the allocator itself is independent
of it.

The allocator follows vLLM 0.33 block for block (the ``exact`` relation) except where 0.33 hands out
a table that reads the null block (known bugs K1-K3, ``harness.ledger.known_bugs``): there it raises
``Refused`` (``impl.allocator.refusals``), which this adapter reports as ``Unsupported``, so the
harness skips that example (a config at reset: K3; a call: K1, K2) and counts it, as it does for
``vllm-fixed``'s start-up check of K3 (``harness.mutants.fixes_vllm``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.glimpse import BlockFacts, Glimpse, GlimpseView, build_glimpse
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops import (
    AllocateSlots,
    AppendOutputTokens,
    Op,
    SetNumComputedTokens,
    SetNumInFlightTokens,
    SetStatus,
)
from kvspec.harness.targets.adapter import ManagerAdapter
from kvspec.harness.targets.base import Unsupported
from kvspec.impl import allocator as alloc
from kvspec.impl.allocator.hashing import BlockHasher
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvspec.spec.releases.profile import BASE
from kvspec.spec.types import BlockHash, GroupId, TokenCount

_FREE_ORDER = {"split": "v0.33", "append": "v0.20"}


class ImplTarget(ManagerAdapter[alloc.Request]):
    """``impl.allocator.KVCacheManager`` driven through the kvspec ``Target`` protocol."""

    name = "impl"

    def __init__(self) -> None:
        super().__init__()
        self._manager: alloc.KVCacheManager | None = None
        self._hasher: BlockHasher | None = None

    @property
    def version(self) -> str:
        return "kvspec impl (vLLM 0.33 semantics; refuses the inputs of known bugs K1-K3)"

    @property
    def manager(self) -> alloc.KVCacheManager:
        assert self._manager is not None, "ImplTarget used before reset(config)"
        return self._manager

    def build(self, config: KVCacheConfig) -> None:
        """A fresh allocator for ``config``.  ``impl`` follows vLLM 0.33.0, and 0.20's free order on
        request; any other release's profile is ``Unsupported``."""
        other = {k: v for k, v in config.profile.knobs().items() if k != "free_order" and v != BASE.knobs()[k]}
        if other:
            differs = ", ".join(sorted(other))
            raise Unsupported(f"impl models vLLM 0.33.0, not profile {config.profile.name!r} ({differs})")
        groups = [
            alloc.GroupSpec(g.kind, g.block_size, g.sliding_window, g.attention_chunk_size) for g in config.groups
        ]
        try:
            self._manager = alloc.KVCacheManager(
                groups,
                num_blocks=config.num_blocks,
                max_model_len=config.max_model_len,
                enable_caching=config.enable_caching,
                hash_block_size=config.hash_block_size,
                enable_events=config.enable_kv_cache_events,
                watermark=config.watermark,
                max_in_flight_tokens=config.max_in_flight_tokens,
                free_order=_FREE_ORDER[config.profile.free_order],
            )
        except alloc.Refused as e:  # a config on which vLLM 0.33 reads the null block (K3)
            raise Unsupported(f"impl refuses {e}") from e
        # vLLM 0.33 EngineCore builds the block hasher only when prefix caching is on (no connector
        # is modelled): with caching off, requests carry no block hashes.
        self._hasher = BlockHasher(config.hash_block_size, config.hash_algo) if config.enable_caching else None

    def apply(self, op: Op) -> Any:
        try:
            return super().apply(op)
        except NotImplementedError as e:  # the allocator's word for a config it leaves out
            raise Unsupported(str(e)) from e
        except alloc.Refused as e:  # a call on which vLLM 0.33 reads the null block (K1, K2)
            raise Unsupported(f"impl refuses {e}") from e

    # -- requests --

    def _rehash(self, native: alloc.Request, r: BookRequest) -> None:
        if self._hasher is not None:
            mm = tuple((m.identifier, m.offset, m.length) for m in r.mm_features)
            self._hasher.extend(native.block_hashes, native.all_token_ids, r.lora, mm, r.cache_salt)

    def new_request(self, r: BookRequest) -> alloc.Request:
        if r.prompt_embeds is not None:
            raise Unsupported("impl's block hasher (impl/allocator/hashing.py) has no prompt_embeds extra keys")
        native = alloc.Request(
            request_id=r.request_id,
            all_token_ids=list(r.prompt_token_ids),
            num_prompt_tokens=len(r.prompt_token_ids),
            skip_reading_prefix_cache=r.skip_reading_prefix_cache,
        )
        self._rehash(native, r)
        return native

    def update_request(self, native: alloc.Request, r: BookRequest, op: Op) -> alloc.Request:
        if isinstance(op, AppendOutputTokens):
            native.all_token_ids.extend(op.token_ids)
            self._rehash(native, r)
        elif isinstance(op, SetNumComputedTokens):
            native.num_computed_tokens = op.num_computed_tokens
        elif isinstance(op, SetStatus):
            native.status = op.status
        elif isinstance(op, SetNumInFlightTokens):
            native.num_in_flight_tokens = op.num_in_flight_tokens
        # drafts: the allocator reads only their count, through allocate_slots' arguments
        return native

    # -- manager calls --

    def get_computed_blocks(self, native: alloc.Request) -> tuple[Any, list[list[int]], int]:
        lists, hit = self.manager.get_computed_blocks(native)
        return lists, [list(x) for x in lists], hit

    def allocate_slots(self, native: alloc.Request, op: AllocateSlots, new_computed_blocks: Any) -> Any:
        new = self.manager.allocate_slots(native, op.num_new_tokens, **op.manager_kwargs(new_computed_blocks))
        return None if new is None else [list(x) for x in new]

    def free(self, native: alloc.Request, request_id: str) -> None:
        self.manager.free(request_id)

    def cache_blocks(self, native: alloc.Request, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(native, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        self.manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        self.manager.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def take_events(self) -> list[Event]:
        return [_to_spec_event(e) for e in self.manager.take_events()]

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
            request_block_hashes={rid: tuple(r.block_hashes) for rid, r in self.book.native.items()},
            block_key_tokens=tuple(None if k is None else n for k, n in zip(pool.key, pool.key_tokens)),
            secondary_keys={b: frozenset(keys) for b, keys in pool.secondary.items() if keys},
        )

    def glimpse(self, requests: Sequence[str], blocks: Collection[int], keys: Collection[bytes]) -> Glimpse:
        """The part of the allocator's state one operation of ``requests`` can change (``harness.core.glimpse``)."""
        m = self._manager
        if m is None:
            raise ValueError("ImplTarget.glimpse called before reset(config)")
        pool = m.pool

        def facts(b: int) -> BlockFacts:
            key = pool.key[b]
            secondary = frozenset(pool.secondary.get(b, ()))
            return (0 if b == 0 else pool.ref[b]), key, None if key is None else pool.key_tokens[b], secondary

        def free_ends(k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
            head: list[int] = []
            tail: list[int] = []
            b = pool.nxt[pool.HEAD]
            while len(head) < k and b != pool.TAIL:
                head.append(b)
                b = pool.nxt[b]
            b = pool.prev[pool.TAIL]
            while len(tail) < k and b != pool.HEAD:
                tail.append(b)
                b = pool.prev[b]
            return tuple(head), tuple(reversed(tail))

        view = GlimpseView(
            tables=[g.tables for g in m.managers],
            num_cached=[g.num_cached for g in m.managers],
            facts=facts,
            cached=lambda k: tuple(pool.cached.get(k, ())),
            num_free=pool.num_free,
            free_ends=free_ends,
            num_cached_keys=len(pool.cached),
            hashes=self.glimpse_hashes,
        )
        return build_glimpse(view, requests, blocks, keys)

    def glimpse_hashes(self, request_id: str) -> tuple[bytes, ...] | None:
        """A request's block hashes, as ``glimpse`` reads them (``harness.check.glimpsing``)."""
        r = self.book.native.get(request_id)
        return None if r is None else tuple(r.block_hashes)


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
