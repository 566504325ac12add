"""The spec itself as a target: the reference every other target is compared with.

Keeps one ``KVCacheManagerState``; the shared dispatch (``harness.targets.adapter``) keeps the
spec ``Request`` values in its request book, and each hook calls the function of
``spec.kv_cache_manager`` / ``spec.request`` of the same name.  ``observe`` is the one place that
turns the spec state into an ``Observation``.  Spec vs spec must never diverge; a copy of this
target with small deliberate bugs
(``harness.mutants.registry``) shows that the harness catches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.glimpse import BlockFacts, Glimpse, GlimpseView, build_glimpse
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.adapter import ManagerAdapter
from kvspec.harness.targets.spec_journal import SpecJournal
from kvspec.spec import kv_cache_manager as kvm
from kvspec.spec import request as rq
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import Event
from kvspec.spec.hashing import MMFeature
from kvspec.spec.persistent import PMap
from kvspec.spec.types import TokenCount

_NO_KEYS: frozenset[bytes] = frozenset()


def make_spec_request(r: BookRequest, config: KVCacheConfig) -> rq.Request:
    """The spec's request for the book record ``r``: its features, its prompt's block hashes."""
    return rq.make_request(
        r.request_id,
        r.prompt_token_ids,
        config,
        lora=r.lora,
        mm_features=tuple(MMFeature(m.identifier, m.offset, m.length) for m in r.mm_features),
        cache_salt=r.cache_salt,
        prompt_embeds=None if r.prompt_embeds is None else tuple(bytes.fromhex(row) for row in r.prompt_embeds),
        skip_reading_prefix_cache=r.skip_reading_prefix_cache,
        prompt_logprob_start=r.prompt_logprob_start,
    )


class SpecTarget(ManagerAdapter[rq.Request]):
    """``--target spec``: kvspec's executable model of vLLM 0.33's ``KVCacheManager``."""

    name = "spec"

    def __init__(self, persistent: bool | None = None) -> None:
        super().__init__()
        self.persistent = persistent  # the pool's representation (spec.persistent); None: by size
        self.state: Any = None
        # The last manager call in spec terms, for ``spec.invariants.check_step``:
        # (state before, operation name, keyword arguments, native outcome, request or None).
        self.last_call: tuple[Any, str, dict[str, Any], Any, Any] | None = None
        # Manager calls shared with another spec target making the same ones (``harness.targets.spec_journal``).
        self.journal: SpecJournal | None = None
        self._group_memo: dict[int, tuple[Any, dict[str, tuple[int, ...]], dict[str, int]]] = {}  # observe()

    @property
    def version(self) -> str:
        from kvspec.harness import __version__

        return f"kvspec {__version__}"

    @property
    def requests(self) -> dict[str, rq.Request]:
        """The spec ``Request`` values of the requests added so far."""
        return self.book.native

    def build(self, config: KVCacheConfig) -> None:
        self.state = kvm.init_kv_cache_manager(config, self.persistent)

    def apply(self, op: O.Op) -> Any:
        self.last_call = None
        return super().apply(op)

    def _call(self, name: str, args: dict[str, Any], request: Any, fn: Any, *fn_args: Any, **fn_kwargs: Any) -> Any:
        """Run ``fn(state, *fn_args, **fn_kwargs)`` (returning a state, or a state and an outcome)
        and record the call for the step invariants."""
        before = self.state
        result = self._spec(fn, *fn_args, **fn_kwargs)
        self.state, outcome = result if isinstance(result, tuple) else (result, None)
        self.last_call = (before, name, args, outcome, request)
        return outcome

    def _spec(self, fn: Any, *fn_args: Any, **fn_kwargs: Any) -> Any:
        """``fn(state, *fn_args, **fn_kwargs)``, through the journal when one is shared."""
        j = self.journal
        return fn(self.state, *fn_args, **fn_kwargs) if j is None else j.call(fn, self.state, *fn_args, **fn_kwargs)

    # --- requests ------------------------------------------------------------------------------

    def new_request(self, r: BookRequest) -> rq.Request:
        assert self.config is not None
        return make_spec_request(r, self.config)

    def update_request(self, native: rq.Request, r: BookRequest, op: O.Op) -> rq.Request:
        if isinstance(op, O.AppendOutputTokens):
            return rq.append_output_token_ids(native, op.token_ids)
        if isinstance(op, O.SetSpecTokens):
            return rq.with_spec_token_ids(native, op.token_ids)
        if isinstance(op, O.SetStatus):
            return rq.with_status(native, rq.RequestStatus(op.status))
        if isinstance(op, O.SetNumInFlightTokens):
            # vLLM 0.33 async scheduling; spec.request has no setter (the field defaults to 0).
            return dataclasses.replace(native, num_in_flight_tokens=TokenCount(op.num_in_flight_tokens))
        assert isinstance(op, O.SetNumComputedTokens)
        n = op.num_computed_tokens
        if n > native.num_tokens_with_spec and n >= 0:
            # vLLM 0.33 clears spec_token_ids when it schedules the drafts, then advances
            # num_computed_tokens by all scheduled tokens (drafts and pad_spec_decode dummies
            # included) until update_from_output rolls the rejected ones back: the count may
            # exceed num_tokens_with_spec for that window.  spec.request asserts otherwise.
            return dataclasses.replace(native, num_computed_tokens=TokenCount(n))
        return rq.with_num_computed_tokens(native, n)

    # --- manager calls -------------------------------------------------------------------------

    def get_computed_blocks(self, native: rq.Request) -> tuple[Any, list[list[int]], int]:
        hit = self._spec(kvm.get_computed_blocks, native)
        self.last_call = (self.state, "get_computed_blocks", {"request_id": native.request_id}, hit, native)
        return hit, [list(g) for g in hit.blocks], int(hit.num_hit_tokens)

    def allocate_slots(self, native: rq.Request, op: O.AllocateSlots, new_computed_blocks: Any) -> Any:
        kwargs = op.manager_kwargs(new_computed_blocks)
        args = {"request_id": op.request_id, "num_new_tokens": op.num_new_tokens, **kwargs}
        new = self._call("allocate_slots", args, native, kvm.allocate_slots, native, op.num_new_tokens, **kwargs)
        return None if new is None else [list(g) for g in new]

    def free(self, native: rq.Request, request_id: str) -> None:
        self._call("free", {"request_id": request_id}, native, kvm.free, request_id)

    def cache_blocks(self, native: rq.Request, num_computed_tokens: int) -> None:
        args = {"request_id": native.request_id, "num_computed_tokens": num_computed_tokens}
        self._call("cache_blocks", args, native, kvm.cache_blocks, native, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        args = {"request_id": request_id, "num_computed_tokens": num_computed_tokens}
        native = self.book.native.get(request_id)
        self._call("remove_skipped_blocks", args, native, kvm.remove_skipped_blocks, request_id, num_computed_tokens)

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        self._call("evict_blocks", {"block_ids": block_ids}, None, kvm.evict_blocks, block_ids)

    def reset_prefix_cache(self) -> bool:
        return bool(self._call("reset_prefix_cache", {}, None, kvm.reset_prefix_cache))

    def take_events(self) -> list[Event]:
        return list(self._call("take_events", {}, None, kvm.take_events))

    # --- observation ---------------------------------------------------------------------------

    def glimpse(self, requests: Sequence[str], blocks: Collection[int], keys: Collection[bytes]) -> Glimpse:
        """The part of the spec state one operation of ``requests`` can change (``harness.core.glimpse``)."""
        s = self.state
        pool = s.pool

        def facts(b: int) -> BlockFacts:
            ref = 0 if b == 0 else pool.ref_cnt[b]
            held = pool.secondary_keys.get(b)
            return ref, pool.block_key[b], pool.block_key_tokens[b], frozenset(held) if held else _NO_KEYS

        fq = pool.free_queue
        view = GlimpseView(
            tables=[g.req_to_blocks for g in s.groups],
            num_cached=[g.num_cached_block for g in s.groups],
            facts=facts,
            cached=lambda k: tuple(pool.cached.get(k, ())),
            num_free=len(fq),
            free_ends=lambda k: (fq[:k], fq[-k:] if fq else ()),  # a LinkedQueue reads only the ends
            num_cached_keys=len(pool.cached),
            hashes=self.glimpse_hashes,
        )
        return build_glimpse(view, requests, blocks, keys)

    def glimpse_hashes(self, request_id: str) -> tuple[bytes, ...] | None:
        """A request's block hashes, as ``glimpse`` reads them (``harness.check.glimpsing``)."""
        r = self.requests.get(request_id)
        return None if r is None else r.block_hashes

    def load_reservation(self, pending: Sequence[tuple[str, int, int]], step_tokens: int) -> int:
        """The blocks vLLM 0.33's scheduler sets aside when it admits an asynchronous load
        (``Scheduler._inflight_prefill_reserved_blocks`` + ``_spec_decode_step_blocks``): for each
        in-flight prefill ``(request id, tokens it must hold, tokens computed)`` the blocks it still
        needs (``get_num_blocks_to_allocate`` with the admission cap, no new hits), plus one
        speculative step of ``step_tokens`` in every group."""
        from kvspec.spec.arith import cdiv
        from kvspec.spec.coordinator import get_num_blocks_to_allocate
        from kvspec.spec.types import RequestId

        needed = sum(
            get_num_blocks_to_allocate(self.state, RequestId(rid), n, (), 0, computed, apply_admission_cap=True)
            for rid, n, computed in pending
        )
        groups = self.state.config.groups
        return needed + (sum(cdiv(step_tokens, int(g.block_size)) for g in groups) if step_tokens else 0)

    def observe(self) -> Observation:
        """The one function that reads the spec state (it already speaks the vocabulary)."""
        s = self.state
        pool = s.pool
        groups = self._observed_groups(s.groups)
        return Observation(
            tables=tuple(tables for _, tables, _ in groups),
            num_cached_block=tuple(cached for _, _, cached in groups),
            # The pool's per-block fields hold plain ints and bytes already (``NewType`` is free at
            # run time): shared, not copied (small pools' tuples, large pools' persistent containers).
            ref_cnt=pool.ref_cnt if not pool.ref_cnt or pool.ref_cnt[0] == 0 else (0, *pool.ref_cnt[1:]),
            free_queue=pool.free_queue,
            block_key=pool.block_key,
            cached=pool.cached if isinstance(pool.cached, PMap) else dict(pool.cached),
            request_block_hashes={rid: r.block_hashes for rid, r in self.requests.items()},
            block_key_tokens=pool.block_key_tokens,
            secondary_keys={int(b): frozenset(keys) for b, keys in pool.secondary_keys.items() if keys},
        )

    def _observed_groups(self, groups: Sequence[Any]) -> list[tuple[Any, dict[str, tuple[int, ...]], dict[str, int]]]:
        """Each group with its tables and cached counts as an observation holds them (read-only
        values), converted once per group: a state's groups are immutable, so an operation that
        leaves a group alone (every request operation) leaves the same object, read from the memo."""
        memo, out = self._group_memo, []
        for g in groups:
            seen = memo.get(id(g))
            if seen is None or seen[0] is not g:
                tables = {str(r): tuple(map(int, t)) for r, t in g.req_to_blocks.items()}
                seen = (g, tables, {str(r): int(n) for r, n in g.num_cached_block.items()})
            out.append(seen)
        self._group_memo = {id(g): seen for g, seen in zip(groups, out, strict=True)}
        return out
