"""The one op dispatch every built-in target shares; a target supplies only its manager calls.

``ManagerAdapter.apply`` turns each ``harness.core.ops`` operation into one call of a small hook and
the outcome into its JSON form (``harness.targets.base``).  The request operations go through the
shared ``harness.core.book.RequestBook`` first, then to the target's request hooks, which keep the
target's own request object in step.  A subclass implements:

- ``build(config)``: a fresh manager for ``config``;
- ``new_request(r)`` and ``update_request(native, r, op)``: the target's request object for the
  book record ``r``, built at ``AddRequest`` and brought up to date after every other request
  operation (returns the object, a new one for value types);
- the manager calls, named after vLLM 0.33 ``KVCacheManager`` methods: ``get_computed_blocks``,
  ``allocate_slots``, ``free``, ``cache_blocks``, ``remove_skipped_blocks``, ``evict_blocks``,
  ``reset_prefix_cache``, ``take_events``;
- ``observe()``: the one reader of the target's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest, RequestBook
from kvspec.harness.core.observation import Observation, event_to_json
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import Event

N = TypeVar("N")  # the target's own request object
BlockIds = list[list[int]]  # block ids per group, as outcomes carry them


class ManagerAdapter(Generic[N]):
    """Base of the built-in targets: the shared book and dispatch around a subclass's hooks."""

    name = "adapter"

    def __init__(self) -> None:
        self.config: KVCacheConfig | None = None
        self.book: RequestBook[N] = RequestBook()

    @property
    def version(self) -> str:
        raise NotImplementedError

    def reset(self, config: KVCacheConfig) -> None:
        """Discard all state and build a fresh manager for ``config``."""
        config.validate()
        self.build(config)
        self.config = config
        self.book = RequestBook()

    def apply(self, op: O.Op) -> Any:
        if self.config is None:
            raise ValueError(f"{type(self).__name__}.apply called before reset(config)")
        return _DISPATCH[type(op)](self, op)

    # --- hooks ---------------------------------------------------------------------------------

    def build(self, config: KVCacheConfig) -> None:
        raise NotImplementedError

    def new_request(self, r: BookRequest) -> N:
        raise NotImplementedError

    def update_request(self, native: N, r: BookRequest, op: O.Op) -> N:
        raise NotImplementedError

    def get_computed_blocks(self, native: N) -> tuple[Any, BlockIds, int]:
        """(the lookup result in the target's form, its block ids, ``num_hit_tokens``)."""
        raise NotImplementedError

    def allocate_slots(self, native: N, op: O.AllocateSlots, new_computed_blocks: Any) -> BlockIds | None:
        raise NotImplementedError

    def free(self, native: N, request_id: str) -> None:
        raise NotImplementedError

    def cache_blocks(self, native: N, num_computed_tokens: int) -> None:
        raise NotImplementedError

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        raise NotImplementedError

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        raise NotImplementedError

    def reset_prefix_cache(self) -> bool:
        raise NotImplementedError

    def take_events(self) -> list[Event]:
        raise NotImplementedError

    def observe(self) -> Observation:
        raise NotImplementedError


# --- the dispatch ----------------------------------------------------------------------------------


def _add_request(t: ManagerAdapter[Any], op: O.AddRequest) -> None:
    r = t.book.apply(op)
    t.book.native[op.request_id] = t.new_request(r)


def _update_request(t: ManagerAdapter[Any], op: Any) -> None:
    native = t.book.get_native(op.request_id)
    r = t.book.apply(op)
    t.book.native[op.request_id] = t.update_request(native, r, op)


def _get_computed_blocks(t: ManagerAdapter[Any], op: O.GetComputedBlocks) -> dict[str, Any]:
    found, block_ids, num_hit_tokens = t.get_computed_blocks(t.book.get_native(op.request_id))
    t.book.remember_lookup(op.request_id, found)
    return {"block_ids": block_ids, "num_hit_tokens": num_hit_tokens}


def _allocate_slots(t: ManagerAdapter[Any], op: O.AllocateSlots) -> dict[str, Any] | None:
    native = t.book.get_native(op.request_id)
    new = t.allocate_slots(native, op, t.book.take_lookup(op))
    return None if new is None else {"block_ids": new}


def _free(t: ManagerAdapter[Any], op: O.Free) -> None:
    t.free(t.book.get_native(op.request_id), op.request_id)
    t.book.forget_lookup(op.request_id)


def _cache_blocks(t: ManagerAdapter[Any], op: O.CacheBlocks) -> None:
    t.cache_blocks(t.book.get_native(op.request_id), op.num_computed_tokens)


def _remove_skipped_blocks(t: ManagerAdapter[Any], op: O.RemoveSkippedBlocks) -> None:
    t.remove_skipped_blocks(op.request_id, op.num_computed_tokens)


def _evict_blocks(t: ManagerAdapter[Any], op: O.EvictBlocks) -> None:
    t.evict_blocks(op.block_ids)


def _reset_prefix_cache(t: ManagerAdapter[Any], op: O.ResetPrefixCache) -> bool:
    return bool(t.reset_prefix_cache())


def _take_events(t: ManagerAdapter[Any], op: O.TakeEvents) -> list[dict[str, Any]]:
    return [event_to_json(e) for e in t.take_events()]


_DISPATCH: dict[type, Callable[[ManagerAdapter[Any], Any], Any]] = {
    O.AddRequest: _add_request,
    O.AppendOutputTokens: _update_request,
    O.SetSpecTokens: _update_request,
    O.SetNumComputedTokens: _update_request,
    O.SetNumInFlightTokens: _update_request,
    O.SetStatus: _update_request,
    O.GetComputedBlocks: _get_computed_blocks,
    O.AllocateSlots: _allocate_slots,
    O.Free: _free,
    O.CacheBlocks: _cache_blocks,
    O.RemoveSkippedBlocks: _remove_skipped_blocks,
    O.EvictBlocks: _evict_blocks,
    O.ResetPrefixCache: _reset_prefix_cache,
    O.TakeEvents: _take_events,
}
assert set(_DISPATCH) == set(O.OP_TYPES.values()), "every operation needs a dispatch entry"
