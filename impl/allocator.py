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
HiSparse, lookahead hashes, retention intervals, DCP/PCP, async in-flight tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

NULL = 0
FREE_ORDERS = ("v0.33", "v0.20")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- events ------------------------------------------------------------------------------------


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


# --- requests ----------------------------------------------------------------------------------

WAITING, RUNNING, PREEMPTED, WAITING_FOR_REMOTE_KVS = "WAITING", "RUNNING", "PREEMPTED", "WAITING_FOR_REMOTE_KVS"


@dataclass(slots=True)
class Request:
    """The fields of vLLM 0.33 ``Request`` that the manager reads."""

    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: str = WAITING
    skip_reading_prefix_cache: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


# --- group specs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One KV-cache group: ``kind`` in full / sliding_window / chunked_local / cross."""

    kind: str
    block_size: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def prefix_cacheable(self) -> bool:
        return self.kind != "cross"


# --- block pool --------------------------------------------------------------------------------


class BlockPool:
    """vLLM 0.33 ``BlockPool`` with its free queue as two int arrays.

    Free-queue links: ``prev[b]`` / ``nxt[b]`` for ``b`` in ``[0, N)``, sentinels ``HEAD = N`` and
    ``TAIL = N + 1``; ``-1`` marks a block that is not queued.  The front is evicted first.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_events: bool = False,
        free_order: str = "v0.33",
    ) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1 (block 0 is the null block), got {num_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}, got {free_order!r}")
        n = num_blocks
        self.num_blocks = n
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_events = enable_events
        self.append_all = free_order == "v0.20"
        self.HEAD, self.TAIL = n, n + 1
        self.ref = [0] * n
        # Queue in ascending id order: HEAD -> 0 -> 1 -> ... -> N-1 -> TAIL; then block 0 is
        # popped as the null block.
        self.nxt = list(range(1, n + 1)) + [0, -1]
        self.prev = [n] + list(range(0, n - 1)) + [-1, n - 1]
        self.nxt[n - 1] = n + 1
        self.num_free = n
        self._popleft_n(1)  # the null block
        self.key: list[bytes | None] = [None] * n  # primary key (hash ++ group id)
        self.key_tokens = [0] * n  # prefix tokens the primary key covers
        self.secondary: dict[int, list[bytes]] = {}  # partial-tail keys of blocks that have a primary
        self.cached: dict[bytes, list[int]] = {}
        self.events: list[Stored | Removed | Cleared] = []

    # -- free queue (vLLM 0.33 FreeKVCacheBlockQueue) --

    def _popleft_n(self, k: int) -> list[int]:
        nxt, prev = self.nxt, self.prev
        out = []
        b = nxt[self.HEAD]
        for _ in range(k):
            out.append(b)
            nb = nxt[b]
            prev[b] = nxt[b] = -1
            b = nb
        nxt[self.HEAD] = b
        prev[b] = self.HEAD
        self.num_free -= k
        return out

    def _remove(self, b: int) -> None:
        nxt, prev = self.nxt, self.prev
        p, q = prev[b], nxt[b]
        if p < 0:
            raise RuntimeError(f"block {b} is not in the free queue")
        nxt[p] = q
        prev[q] = p
        prev[b] = nxt[b] = -1
        self.num_free -= 1

    def _append_n(self, blocks: list[int]) -> None:
        if not blocks:
            return
        nxt, prev = self.nxt, self.prev
        last = prev[self.TAIL]
        for b in blocks:
            prev[b] = last
            nxt[last] = b
            last = b
        nxt[last] = self.TAIL
        prev[self.TAIL] = last
        self.num_free += len(blocks)

    def _prepend_n(self, blocks: list[int]) -> None:
        if not blocks:
            return
        nxt, prev = self.nxt, self.prev
        first = nxt[self.HEAD]
        p = self.HEAD
        for b in blocks:
            prev[b] = p
            nxt[p] = b
            p = b
        nxt[p] = first
        prev[first] = p
        self.num_free += len(blocks)

    def free_queue(self) -> list[int]:
        """Queued block ids, front (evicted first) to tail."""
        out, nxt, b = [], self.nxt, self.nxt[self.HEAD]
        while b != self.TAIL:
            out.append(b)
            b = nxt[b]
        return out

    # -- hash map (vLLM 0.33 BlockHashToBlockMap) --

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """One block per group (the first inserted), or ``None`` if any group misses."""
        cached = self.cached
        out = []
        for gid in group_ids:
            ids = cached.get(block_hash + gid.to_bytes(4, "big"))
            if not ids:
                return None
            out.append(ids[0])
        return out

    def _remove_keys(self, b: int) -> list[bytes]:
        """vLLM 0.33 ``_remove_cached_block_hashes``: drop every key of ``b``; return those removed."""
        keys = []
        if self.key[b] is not None:
            keys.append(self.key[b])
        if self.secondary:
            keys.extend(self.secondary.pop(b, ()))
        if not keys:
            return keys
        removed = []
        cached = self.cached
        for k in keys:
            ids = cached.get(k)
            if ids is not None and b in ids:
                ids.remove(b)
                if not ids:
                    del cached[k]
                removed.append(k)
        self.key[b] = None
        self.key_tokens[b] = 0
        return removed

    def _emit_removed(self, keys: list[bytes]) -> None:
        if self.enable_events:
            for k in keys:
                self.events.append(Removed((k[:-4],), int.from_bytes(k[-4:], "big")))

    def _evict_cached(self, b: int) -> bool:
        """vLLM 0.33 ``_maybe_evict_cached_block``: drop ``b``'s keys, one ``BlockRemoved`` each."""
        removed = self._remove_keys(b)
        self._emit_removed(removed)
        return bool(removed)

    def _contains(self, k: bytes, b: int) -> bool:
        ids = self.cached.get(k)
        return ids is not None and b in ids

    def _insert(self, k: bytes, b: int, num_tokens: int) -> None:
        """vLLM 0.33 ``_insert_block_hash``: the first key becomes primary, later ones secondary."""
        if self.key[b] == k or self._contains(k, b):
            return
        if self.key[b] is None:
            self.key[b] = k
            self.key_tokens[b] = num_tokens
        else:
            self.secondary.setdefault(b, []).append(k)
        ids = self.cached.get(k)
        if ids is None:
            self.cached[k] = [b]
        else:
            ids.append(b)

    # -- pool operations --

    def get_new_blocks(self, k: int) -> list[int]:
        """vLLM 0.33 ``get_new_blocks``: pop ``k`` from the front, evicting their hashes lazily."""
        if k > self.num_free:
            raise ValueError(f"Cannot get {k} free blocks from the pool")
        if k <= 0:
            return []
        out = self._popleft_n(k)
        ref, key = self.ref, self.key
        for b in out:
            if key[b] is not None and self.enable_caching:
                self._evict_cached(b)
            ref[b] = 1
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """vLLM 0.33 ``touch``: ``ref_cnt += 1``, taking ``ref_cnt == 0`` blocks off the queue."""
        ref = self.ref
        for b in blocks:
            if b == NULL:
                continue
            if ref[b] == 0:
                self._remove(b)
            ref[b] += 1

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """vLLM 0.33 ``free_blocks`` (first = evicted first); ``v0.20`` appends everything."""
        ref, key = self.ref, self.key
        if self.append_all:
            blocks = [b for b in ordered if b != NULL]
            for b in blocks:
                ref[b] -= 1
            self._append_n([b for b in blocks if ref[b] == 0])
            return
        front: list[int] = []
        back: list[int] = []
        caching = self.enable_caching
        for b in ordered:
            if b == NULL:
                continue
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if key[b] is None or not caching:
                    front.append(b)
                else:
                    back.append(b)
        self._prepend_n(front)
        self._append_n(back)

    def cache_full_blocks(
        self,
        req: Request,
        table: list[int],
        num_cached: int,
        num_full: int,
        block_size: int,
        gid: int,
        mask: list[bool] | None,
    ) -> None:
        """vLLM 0.33 ``cache_full_blocks``: key table positions ``[num_cached, num_full)``."""
        if num_cached >= num_full:
            return
        hashes = req.block_hashes
        s = block_size // self.hash_block_size
        suffix = gid.to_bytes(4, "big")
        stored: list[bytes] = []
        for i in range(num_cached, num_full):
            b = table[i]
            if b == NULL or (mask is not None and not mask[i - num_cached]):
                continue
            h = hashes[(i + 1) * s - 1]
            if self.key[b] is not None:  # partial -> full promotion of the same block
                self._emit_removed(self._remove_keys(b))
            self._insert(h + suffix, b, (i + 1) * block_size)
            stored.append(h)
        if self.enable_events:
            parent = None if num_cached == 0 else hashes[num_cached * s - 1]
            toks = tuple(req.all_token_ids[num_cached * block_size : num_full * block_size])
            self.events.append(Stored(tuple(stored), parent, toks, block_size, gid))

    def cache_partial_block(self, req: Request, b: int, num_tokens: int, gid: int) -> None:
        """vLLM 0.33 ``cache_partial_block``: make ``b`` reachable from the hash boundary at
        ``num_tokens`` (a multiple of the hash block size inside ``b``)."""
        if b == NULL:
            return
        hbs = self.hash_block_size
        n = num_tokens // hbs
        h = req.block_hashes[n - 1]
        k = h + gid.to_bytes(4, "big")
        already = self.key[b] == k or self._contains(k, b)
        if not already and self.key[b] is not None and self.key_tokens[b] < n * hbs:
            self._emit_removed(self._remove_keys(b))
        self._insert(k, b, n * hbs)
        if self.enable_events and not already:
            parent = req.block_hashes[n - 2] if n > 1 else None
            start = (n - 1) * hbs
            self.events.append(
                Stored((h,), parent, tuple(req.all_token_ids[start:num_tokens]), num_tokens - start, gid)
            )

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """vLLM 0.33 ``evict_blocks``: drop hashes whatever the ref count."""
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"Invalid block_id {b} >= {self.num_blocks}")
            self._evict_cached(b)

    def reset_prefix_cache(self) -> bool:
        """vLLM 0.33 ``reset_prefix_cache``: only when every block but the null one is free."""
        if self.num_blocks - self.num_free != 1:
            return False
        self.cached = {}
        self.secondary = {}
        self.key = [None] * self.num_blocks
        self.key_tokens = [0] * self.num_blocks
        if self.enable_events:
            self.events.append(Cleared())
        return True

    def take_events(self) -> list[Stored | Removed | Cleared]:
        ev, self.events = self.events, []
        return ev if self.enable_events else []


# --- single-type managers ----------------------------------------------------------------------


class SingleTypeManager:
    """vLLM 0.33 ``SingleTypeKVCacheManager`` (full attention by default)."""

    def __init__(
        self, spec: GroupSpec, pool: BlockPool, gid: int, caching: bool, alignment: int, admit_cap: int | None
    ):
        self.spec = spec
        self.pool = pool
        self.gid = gid
        self.block_size = spec.block_size
        self.caching = caching
        self.alignment = alignment  # cache_hit_alignment_tokens
        self.admit_cap = admit_cap
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}
        self.partial_tail = spec.kind == "full"  # vLLM 0.33 FullAttentionManager.cache_blocks

    def skipped_tokens(self, n: int) -> int:
        return 0

    # -- prediction and allocation --

    def num_blocks_to_allocate(
        self, rid: str, num_tokens: int, hits: Sequence[int], total: int, local: int, cap: bool = False
    ) -> int:
        """vLLM 0.33 ``get_num_blocks_to_allocate``."""
        bs = self.block_size
        required = cdiv(num_tokens, bs)
        if cap and self.admit_cap is not None and required > self.admit_cap:
            required = self.admit_cap
        held = len(self.tables.get(rid, ()))
        if rid in self.num_cached:
            if hits:
                raise AssertionError("a running request cannot adopt new prefix-cache hits")
            return max(required - held, 0)
        skipped = self.skipped_tokens(total) // bs
        new = max(required - max(skipped, len(hits) + held), 0)
        ref = self.pool.ref
        evictable = 0
        for b in hits[max(0, skipped - held) :]:
            if b != NULL and ref[b] == 0:
                evictable += 1
        if hits and local % bs:
            raise NotImplementedError("partial (sub-block) prefix hits are out of scope")
        return new + evictable

    def add_local_computed_blocks(self, rid: str, hits: Sequence[int], local: int, ext: int) -> None:
        """vLLM 0.33 ``add_local_computed_blocks``: touch the in-window hits, pad nulls."""
        table = self.tables.setdefault(rid, [])
        if table:
            raise AssertionError(f"request {rid!r} already holds blocks in group {self.gid}")
        skipped = self.skipped_tokens(local + ext) // self.block_size
        kept = hits[skipped:] if skipped > 0 else hits
        if self.caching:
            self.pool.touch(kept)
        elif any(b != NULL for b in kept):
            raise AssertionError("prefix hits with caching disabled")
        if skipped:
            table.extend([NULL] * skipped)
        table.extend(kept)
        self.num_cached[rid] = len(table)

    def allocate_external_computed_blocks(self, rid: str, local: int, ext: int) -> None:
        """vLLM 0.33 ``allocate_external_computed_blocks``."""
        total = local + ext
        skipped = self.skipped_tokens(total)
        if skipped > 0:
            ext = min(total - skipped, ext)
        if ext <= 0:
            return
        table = self.tables.setdefault(rid, [])
        k = max(0, cdiv(total, self.block_size) - len(table))
        table.extend(self.pool.get_new_blocks(k))

    def allocate_new_blocks(self, rid: str, num_tokens: int) -> list[int]:
        """vLLM 0.33 ``allocate_new_blocks``: grow the table to ``cdiv(num_tokens, bs)``."""
        table = self.tables.setdefault(rid, [])
        k = cdiv(num_tokens, self.block_size) - len(table)
        if k <= 0:
            return []
        new = self.pool.get_new_blocks(k)
        table.extend(new)
        return new

    # -- caching --

    def cache_mask(self, start: int, end: int) -> list[bool] | None:
        return None

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """vLLM 0.33 ``SingleTypeKVCacheManager.cache_blocks``."""
        rid = req.request_id
        num_cached = self.num_cached.get(rid, 0)
        hashed = len(req.block_hashes) * self.pool.hash_block_size
        full = (num_tokens if num_tokens < hashed else hashed) // self.block_size
        if num_cached < full:
            table = self.tables.setdefault(rid, [])
            self.pool.cache_full_blocks(
                req, table, num_cached, full, self.block_size, self.gid, self.cache_mask(num_cached, full)
            )
            self.num_cached[rid] = full
        if self.partial_tail and self.block_size != self.pool.hash_block_size:
            self.cache_partial_tail(req, num_tokens)

    def cache_partial_tail(self, req: Request, num_tokens: int) -> None:
        """vLLM 0.33 ``FullAttentionManager._cache_partial_tail_block``: when the group's block is
        coarser than the hash block, register the last prompt hash boundary before
        ``num_prompt_tokens - 1`` that falls inside a block as an extra key of that block."""
        hbs = self.pool.hash_block_size
        boundary = min((req.num_prompt_tokens - 1) // hbs, len(req.block_hashes)) * hbs
        if boundary <= 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        table = self.tables.setdefault(req.request_id, [])
        idx = boundary // self.block_size
        if idx < len(table):
            self.pool.cache_partial_block(req, table[idx], boundary, self.gid)

    # -- release --

    def free(self, rid: str) -> None:
        """vLLM 0.33 ``free``: tail first, leading null run trimmed."""
        table = self.tables.pop(rid, None)
        self.num_cached.pop(rid, None)
        if table:
            self.pool.free_blocks(reversed(table))

    def remove_skipped_blocks(self, rid: str, processed: int) -> None:
        """vLLM 0.33 ``remove_skipped_blocks``: null the out-of-window prefix, freeing backwards."""
        s = self.skipped_tokens(processed)
        if s <= 0:
            return
        table = self.tables.setdefault(rid, [])
        k = min(s // self.block_size, len(table))
        freed = []
        for i in range(k - 1, -1, -1):
            b = table[i]
            if b == NULL:
                break
            freed.append(b)
            table[i] = NULL
        if freed:
            self.pool.free_blocks(freed)

    # -- lookup --

    def hash_view(self, hashes: list[bytes]) -> tuple[int, int]:
        """(scale, number of group-size hashes) of the request's hashes at this block size."""
        s = self.block_size // self.pool.hash_block_size
        return s, len(hashes) // s

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, gids: list[int], alignment: int
    ) -> tuple[list[list[int]], int]:
        """vLLM 0.33 ``FullAttentionManager.find_longest_cache_hit``: left to right, stop at a miss."""
        bs = self.block_size
        s, nh = self.hash_view(hashes)
        out: list[list[int]] = [[] for _ in gids]
        get = self.pool.get_cached_block
        for j in range(min(max_length // bs, nh)):
            got = get(hashes[(j + 1) * s - 1], gids)
            if got is None:
                break
            for lst, b in zip(out, got):
                lst.append(b)
        hit = len(out[0]) * bs
        hit -= hit % alignment
        n = cdiv(hit, bs)
        for lst in out:
            del lst[n:]
        return out, hit


class SlidingWindowManager(SingleTypeManager):
    """vLLM 0.33 ``SlidingWindowManager``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.window = self.spec.sliding_window
        self.need = cdiv(self.window - 1, self.block_size)

    def skipped_tokens(self, n: int) -> int:
        return max(0, n - self.window + 1)

    def cache_mask(self, start: int, end: int) -> list[bool] | None:
        """vLLM 0.33 ``SlidingWindowManager.reachable_block_mask`` (dense retention, no EAGLE)."""
        if self.alignment % self.block_size:
            return None
        per_segment = self.alignment // self.block_size
        if self.need >= per_segment:
            return None
        lo = per_segment - self.need
        return [i % per_segment >= lo for i in range(start, end)]

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, gids: list[int], alignment: int
    ) -> tuple[list[list[int]], int]:
        """Right to left; the first run of ``need`` cached blocks wins, else the cached run from block 0."""
        bs = self.block_size
        s, _ = self.hash_view(hashes)
        maxb = max_length // bs
        out = [[NULL] * maxb for _ in gids]
        get = self.pool.get_cached_block
        need = self.need
        run = 0
        found = False
        for i in range(maxb - 1, -1, -1):
            got = get(hashes[(i + 1) * s - 1], gids)
            if got is None:
                run = 0
                continue
            if run == 0 and bs != alignment and ((i + 1) * bs) % alignment:
                continue
            for lst, b in zip(out, got):
                lst[i] = b
            run += 1
            if run >= need:
                for lst in out:
                    del lst[i + run :]
                found = True
                break
        if not found:
            for lst in out:
                del lst[run:]
            while bs != alignment and (len(out[0]) * bs) % alignment:
                for lst in out:
                    lst.pop()
        return out, len(out[0]) * bs


class ChunkedLocalManager(SingleTypeManager):
    """vLLM 0.33 ``ChunkedLocalAttentionManager``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.chunk = self.spec.attention_chunk_size

    def skipped_tokens(self, n: int) -> int:
        return (n // self.chunk) * self.chunk

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, gids: list[int], alignment: int
    ) -> tuple[list[list[int]], int]:
        """Blocks before the chunk of ``max_length`` count as hit (nulls); then left to right."""
        bs = self.block_size
        if bs != alignment:
            raise NotImplementedError("chunked local attention with a hybrid of different block sizes")
        s, _ = self.hash_view(hashes)
        maxb = max_length // bs
        start = (max_length // self.chunk) * self.chunk if max_length > 0 else 0
        sb = start // bs
        out = [[NULL] * sb for _ in gids]
        get = self.pool.get_cached_block
        for i in range(sb, maxb):
            got = get(hashes[(i + 1) * s - 1], gids)
            if got is None:
                break
            for lst, b in zip(out, got):
                lst.append(b)
        return out, len(out[0]) * bs


class CrossAttentionManager(SingleTypeManager):
    """vLLM 0.33 ``CrossAttentionManager``: blocks for encoder tokens, never cached."""

    def add_local_computed_blocks(self, rid: str, hits: Sequence[int], local: int, ext: int) -> None:
        if hits:
            raise AssertionError("cross-attention cannot have prefix hits")

    def allocate_external_computed_blocks(self, rid: str, local: int, ext: int) -> None:
        return

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        raise ValueError("cross-attention blocks are never cached (prefix caching must be off)")

    def find_longest_cache_hit(self, hashes, max_length, gids, alignment):  # type: ignore[override]
        raise NotImplementedError("cross-attention does not support prefix caching")


MANAGER_CLASSES = {
    "full": SingleTypeManager,
    "sliding_window": SlidingWindowManager,
    "chunked_local": ChunkedLocalManager,
    "cross": CrossAttentionManager,
}


def admission_cap(spec: GroupSpec, max_in_flight: int, max_model_len: int) -> int | None:
    """vLLM 0.33 ``max_admission_blocks_per_request`` (recycling specs only)."""
    if spec.kind == "sliding_window":
        return cdiv(min(spec.sliding_window - 1 + max_in_flight, max_model_len), spec.block_size) + 1
    if spec.kind == "chunked_local":
        return cdiv(min(spec.attention_chunk_size + max_in_flight, max_model_len), spec.block_size)
    return None


# --- the manager (coordinator folded in) -------------------------------------------------------


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
        empty = tuple([] for _ in self.managers)
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
                for gid, lst in zip(gids, lists):
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
                lst = by_group[gid]
                if lst is not None:
                    del lst[k:]
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
        for m, h in zip(self.managers, hits):
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
        if (
            self._all_full
            and not ext
            and not full_sequence_must_fit
            and not (new_computed_blocks is not None and any(len(h) for h in new_computed_blocks))
        ):
            return self._allocate_plain(
                req,
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                delay_cache_blocks,
                reserved_blocks,
                has_scheduled_reqs,
            )
        hits: Sequence[Sequence[int]]
        has_hits = new_computed_blocks is not None and any(len(h) for h in new_computed_blocks)
        hits = new_computed_blocks if has_hits else tuple(() for _ in self.managers)  # type: ignore[assignment]
        rid = req.request_id
        local = req.num_computed_tokens + num_new_computed_tokens
        if has_hits:
            for m, h in zip(self.managers, hits):
                if h and local % m.block_size and rid not in m.num_cached:
                    raise NotImplementedError("partial (sub-block) prefix hits are out of scope")
        total = min(local + ext, self.max_model_len)
        wm = self.watermark_blocks if has_scheduled_reqs and req.status in (WAITING, PREEMPTED) else 0
        pool = self.pool
        if full_sequence_must_fit:
            full = min(req.num_tokens, self.max_model_len)
            if self._predict(rid, full, hits, num_encoder_tokens, total, local, cap=True) + wm > pool.num_free:
                return None
        main = total + num_new_tokens
        need_slot = min(main + num_lookahead_tokens, self.max_model_len)
        for m in self.managers:
            m.remove_skipped_blocks(rid, total)
        k = self._predict(rid, need_slot, hits, num_encoder_tokens, local + ext, local)
        if k + wm > pool.num_free - reserved_blocks:
            return None
        if has_hits or ext > 0:
            self._allocate_new_computed_blocks(rid, hits, local, ext)
        new = tuple(
            m.allocate_new_blocks(rid, num_encoder_tokens if m.spec.kind == "cross" else need_slot)
            for m in self.managers
        )
        if not delay_cache_blocks:
            self.cache_blocks(req, min(total + num_new_tokens, req.num_tokens))
        return new

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
        for m, h in zip(self.managers, hits):
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
        for m in self.managers:
            m.free(rid)

    def remove_skipped_blocks(self, rid: str, num_computed_tokens: int) -> None:
        for m in self.managers:
            m.remove_skipped_blocks(rid, num_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def take_events(self) -> list[Stored | Removed | Cleared]:
        return self.pool.take_events()

    def get_block_ids(self, rid: str) -> tuple[list[int], ...]:
        return tuple(list(m.tables.get(rid) or ()) for m in self.managers)
