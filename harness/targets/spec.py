"""The spec itself as a target: the reference every other target is compared with.

Keeps one ``KVCacheManagerState`` and the spec ``Request`` values the scheduler has built, and
applies each ``harness.ops`` operation with the function of ``spec.kv_cache_manager`` /
``spec.request`` of the same name.  ``observe`` is the one place that turns the spec state into an
``Observation``.  Spec vs spec must never diverge; a copy of this target with small deliberate bugs
(``harness.mutants``) shows that the harness catches them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness import ops as O
from harness.observation import Observation, event_to_json
from harness.targets.base import Unsupported
from spec import kv_cache_manager as kvm
from spec import request as rq
from spec.config import KVCacheConfig
from spec.hashing import MMFeature


class SpecTarget:
    """``--target spec``: kvspec's executable model of vLLM 0.33's ``KVCacheManager``."""

    name = "spec"

    def __init__(self) -> None:
        self.config: KVCacheConfig | None = None
        self.state: Any = None
        self.requests: dict[str, rq.Request] = {}
        self._computed: dict[str, Any] = {}  # request id -> ComputedBlocks of its last lookup
        # The last manager call in spec terms, for ``spec.invariants.check_step``:
        # (state before, operation name, keyword arguments, native outcome, request or None).
        self.last_call: tuple[Any, str, dict[str, Any], Any, Any] | None = None

    @property
    def version(self) -> str:
        from harness import __version__

        return f"kvspec {__version__}"

    def reset(self, config: KVCacheConfig) -> None:
        self.config = config
        self.state = kvm.init_kv_cache_manager(config)
        self.requests = {}
        self._computed = {}

    def _req(self, request_id: str) -> rq.Request:
        try:
            return self.requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r} (no add_request before)") from None

    def apply(self, op: O.Op) -> Any:
        method = getattr(self, "_" + op.op, None)
        if method is None:
            raise Unsupported(f"spec target: no operation {op.op!r}")
        self.last_call = None
        return method(op)

    def _called(self, before: Any, name: str, args: dict[str, Any], outcome: Any, request: Any = None) -> None:
        self.last_call = (before, name, args, outcome, request)

    # --- request lifecycle ---------------------------------------------------------------------

    def _add_request(self, op: O.AddRequest) -> None:
        if op.request_id in self.requests:
            raise ValueError(f"request {op.request_id!r} added twice")
        assert self.config is not None
        self.requests[op.request_id] = rq.make_request(
            op.request_id,
            op.prompt_token_ids,
            self.config,
            lora=op.lora,
            mm_features=tuple(MMFeature(m.identifier, m.offset, m.length) for m in op.mm_features),
            cache_salt=op.cache_salt,
            skip_reading_prefix_cache=op.skip_reading_prefix_cache,
        )

    def _append_output_tokens(self, op: O.AppendOutputTokens) -> None:
        self.requests[op.request_id] = rq.append_output_token_ids(self._req(op.request_id), op.token_ids)

    def _set_spec_tokens(self, op: O.SetSpecTokens) -> None:
        self.requests[op.request_id] = rq.with_spec_token_ids(self._req(op.request_id), op.token_ids)

    def _set_num_computed_tokens(self, op: O.SetNumComputedTokens) -> None:
        req = self._req(op.request_id)
        if op.num_computed_tokens > req.num_tokens_with_spec and op.num_computed_tokens >= 0:
            # vLLM 0.33 clears spec_token_ids when it schedules the drafts, then advances
            # num_computed_tokens by all scheduled tokens (drafts and pad_spec_decode dummies
            # included) until update_from_output rolls the rejected ones back: the count may
            # exceed num_tokens_with_spec for that window.  spec.request asserts otherwise.
            self.requests[op.request_id] = dataclasses.replace(req, num_computed_tokens=op.num_computed_tokens)
            return
        self.requests[op.request_id] = rq.with_num_computed_tokens(req, op.num_computed_tokens)

    def _set_status(self, op: O.SetStatus) -> None:
        self.requests[op.request_id] = rq.with_status(self._req(op.request_id), rq.RequestStatus(op.status))

    # --- manager calls -------------------------------------------------------------------------

    def _get_computed_blocks(self, op: O.GetComputedBlocks) -> dict[str, Any]:
        req = self._req(op.request_id)
        hit = kvm.get_computed_blocks(self.state, req)
        self._computed[op.request_id] = hit
        self._called(self.state, "get_computed_blocks", {"request_id": op.request_id}, hit, req)
        return {"block_ids": [list(g) for g in hit.blocks], "num_hit_tokens": int(hit.num_hit_tokens)}

    def _allocate_slots(self, op: O.AllocateSlots) -> dict[str, Any] | None:
        req = self._req(op.request_id)
        kwargs = op.manager_kwargs(op.take_computed_blocks(self._computed))
        before = self.state
        self.state, new = kvm.allocate_slots(self.state, req, op.num_new_tokens, **kwargs)
        self._called(before, "allocate_slots", {"request_id": op.request_id, "num_new_tokens": op.num_new_tokens, **kwargs}, new, req)
        return None if new is None else {"block_ids": [list(g) for g in new]}

    def _free(self, op: O.Free) -> None:
        before = self.state
        self.state = kvm.free(self.state, op.request_id)
        self._called(before, 'free', {"request_id": op.request_id}, None, self.requests.get(op.request_id))
        self._computed.pop(op.request_id, None)

    def _cache_blocks(self, op: O.CacheBlocks) -> None:
        before = self.state
        self.state = kvm.cache_blocks(self.state, self._req(op.request_id), op.num_computed_tokens)
        self._called(before, 'cache_blocks', {"request_id": op.request_id, "num_computed_tokens": op.num_computed_tokens}, None, self.requests.get(op.request_id))

    def _remove_skipped_blocks(self, op: O.RemoveSkippedBlocks) -> None:
        before = self.state
        self.state = kvm.remove_skipped_blocks(self.state, op.request_id, op.num_computed_tokens)
        self._called(before, 'remove_skipped_blocks', {"request_id": op.request_id, "num_computed_tokens": op.num_computed_tokens}, None, self.requests.get(op.request_id))

    def _evict_blocks(self, op: O.EvictBlocks) -> None:
        before = self.state
        self.state = kvm.evict_blocks(self.state, op.block_ids)
        self._called(before, 'evict_blocks', {"block_ids": op.block_ids}, None, None)

    def _reset_prefix_cache(self, op: O.ResetPrefixCache) -> bool:
        before = self.state
        self.state, ok = kvm.reset_prefix_cache(self.state)
        self._called(before, "reset_prefix_cache", {}, ok)
        return bool(ok)

    def _take_events(self, op: O.TakeEvents) -> list[dict[str, Any]]:
        before = self.state
        self.state, events = kvm.take_events(self.state)
        self._called(before, "take_events", {}, events)
        return [event_to_json(e) for e in events]

    # --- observation ---------------------------------------------------------------------------

    def observe(self) -> Observation:
        """The one function that reads the spec state (it already speaks the vocabulary)."""
        s = self.state
        pool = s.pool
        return Observation(
            tables=tuple({str(r): tuple(int(b) for b in t) for r, t in g.req_to_blocks.items()} for g in s.groups),
            num_cached_block=tuple({str(r): int(n) for r, n in g.num_cached_block.items()} for g in s.groups),
            ref_cnt=(0,) + tuple(int(c) for c in pool.ref_cnt[1:]),
            free_queue=tuple(int(b) for b in pool.free_queue),
            block_key=tuple(None if k is None else bytes(k) for k in pool.block_key),
            cached={bytes(k): tuple(int(b) for b in ids) for k, ids in pool.cached.items()},
            request_block_hashes={rid: tuple(bytes(h) for h in r.block_hashes) for rid, r in self.requests.items()},
            block_key_tokens=tuple(pool.block_key_tokens),
            secondary_keys={int(b): frozenset(keys) for b, keys in pool.secondary_keys.items() if keys},
        )
