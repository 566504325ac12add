"""vLLM 0.33 ``BlockPool`` + ``FreeKVCacheBlockQueue`` + ``BlockHashToBlockMap`` on flat arrays.

Blocks are plain ints; ``ref_cnt``, the free-queue links and the primary hash key live in
per-block lists, so the doubly linked free queue costs O(1) per remove/append/prepend and no
operation scans the whole pool (``free_queue`` dumps aside).  The hash map is
``dict[key, list[int]]`` (insertion order; first = returned by lookups), a key being the block
hash followed by the 4-byte big-endian group id.

Free order: ``free_order="v0.33"`` puts blocks that reach ``ref_cnt == 0`` unhashed at the front
(in the given order) and hashed at the tail; ``"v0.20"`` appends them all (vLLM <= 0.20).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvspec.impl.allocator.events import Cleared, KVEvent, Removed, Stored
from kvspec.impl.allocator.request import Request

NULL = 0  # the null block: table placeholder for skipped / out-of-window positions
FREE_ORDERS = ("v0.33", "v0.20")


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
        self.events: list[KVEvent] = []

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
        keys: list[bytes] = []
        primary = self.key[b]
        if primary is not None:
            keys.append(primary)
        if self.secondary:
            keys.extend(self.secondary.pop(b, ()))
        if not keys:
            return keys
        removed: list[bytes] = []
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

    def take_events(self) -> list[KVEvent]:
        ev, self.events = self.events, []
        return ev if self.enable_events else []
