"""vLLM 0.33 ``KVCacheManager`` with its coordinator folded in (no-cache / unitary / hybrid).

The manager owns one ``BlockPool`` shared by one ``SingleTypeManager`` per KV-cache group.  It
validates the group layout, answers prefix lookups (a hybrid of groups searches for the longest
hit every group agrees on), predicts and performs allocations, and forwards caching, freeing and
eviction to the groups and the pool.  Where vLLM 0.33 would hand out a table that reads the null
block (its known bugs K1-K3) it raises ``refusals.Refused`` instead, before anything changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from kvspec.impl.allocator.block_pool import BlockPool
from kvspec.impl.allocator.events import KVEvent
from kvspec.impl.allocator.refusals import check_admission, check_chunk_multiples, check_resume
from kvspec.impl.allocator.request import PREEMPTED, WAITING, GroupSpec, Request
from kvspec.impl.allocator.single_type_managers import MANAGER_CLASSES, admission_cap, cdiv


class KVCacheManager:
    """vLLM 0.33 ``KVCacheManager`` over a no-cache / unitary / hybrid coordinator.

    Hit lists and allocation results are tuples of per-group ``list[int]``.
    """

    def __init__(
        self,
        groups: Sequence[GroupSpec],
        num_blocks: int,
        max_model_len: int,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        enable_events: bool = False,
        watermark: float = 0.0,
        max_in_flight_tokens: int | None = None,
        free_order: str = "v0.33",
    ) -> None:
        if not groups:
            raise ValueError("at least one KV-cache group is needed")
        check_chunk_multiples(groups)
        cacheable = [g.block_size for g in groups if g.prefix_cacheable] or [g.block_size for g in groups]
        self.hash_block_size = hash_block_size or math.gcd(*cacheable)
        self.scheduler_block_size = math.lcm(*(g.block_size for g in groups))
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.groups = tuple(groups)
        if enable_caching and any(not g.prefix_cacheable for g in groups):
            raise ValueError("cross-attention groups require enable_caching=False")
        for g in groups:
            if g.prefix_cacheable and g.block_size % self.hash_block_size:
                raise ValueError(
                    f"block_size {g.block_size} is not a multiple of hash_block_size {self.hash_block_size}"
                )
        if enable_caching and len(groups) == 1 and self.hash_block_size != groups[0].block_size:
            raise ValueError("a single group needs hash_block_size == block_size")
        self.mode = "none" if not enable_caching else ("unitary" if len(groups) == 1 else "hybrid")
        self.pool = BlockPool(num_blocks, enable_caching, self.hash_block_size, enable_events, free_order)
        in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        align = self.scheduler_block_size
        self.managers = tuple(
            MANAGER_CLASSES[g.kind](
                g, self.pool, gid, enable_caching, align, admission_cap(g, in_flight, max_model_len)
            )
            for gid, g in enumerate(groups)
        )
        self.watermark_blocks = int(watermark * num_blocks)
        self._spec_groups = self._split_spec_groups() if self.mode == "hybrid" else []
        self._all_full = all(g.kind == "full" for g in groups)
        self._windowed = any(g.kind in ("sliding_window", "chunked_local") for g in groups)
        # Per request, the largest token count its windows were measured on (admission, removal):
        # a later query before it is a request moved back (refusals.check_resume).
        self._measured: dict[str, int] = {}

    def _split_spec_groups(self) -> list[tuple[GroupSpec, list[int]]]:
        """vLLM 0.33 ``verify_and_split_kv_cache_groups``: equal specs looked up jointly, full first."""
        out: list[tuple[GroupSpec, list[int]]] = []
        for gid, g in enumerate(self.groups):
            if not g.prefix_cacheable:
                continue
            for spec, ids in out:
                if spec == g:
                    ids.append(gid)
                    break
            else:
                out.append((g, [gid]))
        out.sort(key=lambda sg: sg[0].kind != "full")
        return out

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    # -- lookup --

    def get_computed_blocks(self, req: Request) -> tuple[tuple[list[int], ...], int]:
        """vLLM 0.33 ``get_computed_blocks``: pure; cap ``num_tokens - 1``."""
        empty: tuple[list[int], ...] = tuple([] for _ in self.managers)
        if not self.enable_caching or req.skip_reading_prefix_cache:
            return empty, 0
        cap = req.num_tokens - 1
        if self.mode == "unitary":
            m = self.managers[0]
            lists, hit = m.find_longest_cache_hit(req.block_hashes, cap, [0], m.block_size)
            return (lists[0],), hit
        return self._hybrid_hit(req.block_hashes, cap)

    def _hybrid_hit(self, hashes: list[bytes], cap: int) -> tuple[tuple[list[int], ...], int]:
        """vLLM 0.33 ``HybridKVCacheCoordinator.find_longest_cache_hit``: fixed point over spec groups."""
        n = len(self.managers)
        by_group: list[list[int] | None] = [None] * n
        len_by_group = [0] * n
        hit = cap
        align = self.scheduler_block_size
        simple = len(self._spec_groups) == 2 and self._spec_groups[0][0].kind == "full"
        while True:
            cur = hit
            for spec, gids in self._spec_groups:
                first = gids[0]
                if spec.kind == "full" and by_group[first] is not None:
                    cur = min(cur, len_by_group[first])
                    continue
                lists, new = self.managers[first].find_longest_cache_hit(hashes, cur, gids, align)
                cur = new
                for gid, lst in zip(gids, lists, strict=True):
                    by_group[gid] = lst
                    len_by_group[gid] = new
            if cur >= hit:
                break
            hit = cur
            if simple:
                break
        for spec, gids in self._spec_groups:
            if spec.kind != "full":
                continue
            k = cdiv(hit, spec.block_size)
            for gid in gids:
                kept = by_group[gid]
                if kept is not None:
                    del kept[k:]
        return tuple(lst if lst is not None else [] for lst in by_group), hit

    # -- allocation --

    def _predict(
        self,
        rid: str,
        num_tokens: int,
        hits: Sequence[Sequence[int]],
        enc: int,
        total: int,
        local: int,
        cap: bool = False,
    ) -> int:
        k = 0
        for m, h in zip(self.managers, hits, strict=False):
            if m.spec.kind == "cross":
                k += m.num_blocks_to_allocate(rid, enc, (), 0, 0, cap)
            else:
                k += m.num_blocks_to_allocate(rid, num_tokens, h, total, local, cap)
        return k

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[Sequence[int]] | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> tuple[list[int], ...] | None:
        """vLLM 0.33 ``allocate_slots``: None when out of blocks, else the newly allocated blocks."""
        ext = num_external_computed_tokens
        if num_new_tokens == 0 and ext == 0 and num_new_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        has_hits = new_computed_blocks is not None and any(len(h) for h in new_computed_blocks)
        if self._all_full and not ext and not full_sequence_must_fit and not has_hits:
            return self._allocate_plain(
                req,
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                delay_cache_blocks,
                reserved_blocks,
                has_scheduled_reqs,
            )
        hits: Sequence[Sequence[int]] = tuple(() for _ in self.managers)
        if has_hits and new_computed_blocks is not None:
            hits = new_computed_blocks
        rid = req.request_id
        local = req.num_computed_tokens + num_new_computed_tokens
        if has_hits:
            for m, h in zip(self.managers, hits, strict=False):
                if h and local % m.block_size and rid not in m.num_cached:
                    raise NotImplementedError("partial (sub-block) prefix hits are out of scope")
        total = min(local + ext, self.max_model_len)
        if self._windowed:
            self._check_window_reads(req, local + ext, num_new_tokens, has_hits or ext > 0)
        wm = self.watermark_blocks if has_scheduled_reqs and req.status in (WAITING, PREEMPTED) else 0
        pool = self.pool
        if full_sequence_must_fit:
            full = min(req.num_tokens, self.max_model_len)
            if self._predict(rid, full, hits, num_encoder_tokens, total, local, cap=True) + wm > pool.num_free:
                return None
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        # vLLM 0.26+: the window is measured on the processed tokens (K9 frees on the computed total).
        processed = max(0, total - req.num_in_flight_tokens)
        self.remove_skipped_blocks(rid, processed)
        k = self._predict(rid, need_slot, hits, num_encoder_tokens, local + ext, local)
        if k + wm > pool.num_free - reserved_blocks:
            return None
        if has_hits or ext > 0:
            self._allocate_new_computed_blocks(rid, hits, local, ext)
            self._note_measured(rid, local + ext)
        new = tuple(
            m.allocate_new_blocks(rid, num_encoder_tokens if m.spec.kind == "cross" else need_slot)
            for m in self.managers
        )
        if not delay_cache_blocks:
            self.cache_blocks(req, min(total + num_new_tokens, req.num_tokens))
        return new

    def _check_window_reads(self, req: Request, computed: int, num_new_tokens: int, adopting: bool) -> None:
        """Refuse (``refusals``) an admission that releases a block the next query reads (K1), or a
        request moved back to a token whose window its table released (K2)."""
        rid = req.request_id
        if adopting and not any(rid in m.num_cached for m in self.managers):
            check_admission(self.managers, computed, req.num_tokens)
        elif num_new_tokens and computed < self._measured.get(rid, 0):
            check_resume(self.managers, rid, computed)

    def _note_measured(self, rid: str, num_tokens: int) -> None:
        """Record that ``rid``'s windows were measured on ``num_tokens`` (a request holding blocks only:
        the scheduler also removes skipped blocks of finished requests)."""
        if not self._windowed or num_tokens <= self._measured.get(rid, 0):
            return
        if any(m.tables.get(rid) for m in self.managers):
            self._measured[rid] = num_tokens

    def _allocate_plain(
        self,
        req: Request,
        num_new: int,
        num_new_computed: int,
        lookahead: int,
        delay: bool,
        reserved: int,
        has_scheduled_reqs: bool,
    ) -> tuple[list[int], ...] | None:
        """``allocate_slots`` when every group is full attention and there is nothing to adopt: no
        skipped blocks, and the prediction is ``max(cdiv(need_slot, bs) - held, 0)`` per group
        (the running fast path and the admission formula agree when there are no hits)."""
        total = req.num_computed_tokens + num_new_computed
        if total > self.max_model_len:
            total = self.max_model_len
        need_slot = total + num_new + lookahead
        if need_slot > self.max_model_len:
            need_slot = self.max_model_len
        rid = req.request_id
        k = 0
        for m in self.managers:
            held = len(m.tables.get(rid, ()))
            grow = -(-need_slot // m.block_size) - held
            if grow > 0:
                k += grow
        wm = self.watermark_blocks if has_scheduled_reqs and req.status in (WAITING, PREEMPTED) else 0
        pool = self.pool
        if k + wm > pool.num_free - reserved:
            return None
        new = tuple(m.allocate_new_blocks(rid, need_slot) for m in self.managers)
        if not delay:
            n = total + num_new
            self.cache_blocks(req, n if n < req.num_tokens else req.num_tokens)
        return new

    def _allocate_new_computed_blocks(self, rid: str, hits: Sequence[Sequence[int]], local: int, ext: int) -> None:
        """vLLM 0.33 two-phase adoption: touch every group's hits, then allocate external blocks."""
        if any(rid in m.num_cached for m in self.managers):
            if any(len(h) for h in hits):
                raise AssertionError("a running request cannot adopt new prefix-cache hits")
            return
        for m, h in zip(self.managers, hits, strict=False):
            m.add_local_computed_blocks(rid, h, local, ext)
        if ext > 0:
            for m in self.managers:
                m.allocate_external_computed_blocks(rid, local, ext)

    def cache_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """vLLM 0.33 ``KVCacheManager.cache_blocks`` / coordinator ``cache_blocks``."""
        if not self.enable_caching:
            return
        n = max(0, num_computed_tokens)
        if self.mode == "hybrid":
            n -= n % self.scheduler_block_size
        for m in self.managers:
            m.cache_blocks(req, n)

    # -- release --

    def free(self, rid: str) -> None:
        self._measured.pop(rid, None)
        for m in self.managers:
            m.free(rid)

    def remove_skipped_blocks(self, rid: str, num_computed_tokens: int) -> None:
        for m in self.managers:
            m.remove_skipped_blocks(rid, num_computed_tokens)
        self._note_measured(rid, num_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def take_events(self) -> list[KVEvent]:
        return self.pool.take_events()

    def get_block_ids(self, rid: str) -> tuple[list[int], ...]:
        return tuple(list(m.tables.get(rid) or ()) for m in self.managers)
