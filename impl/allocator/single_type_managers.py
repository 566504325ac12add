"""vLLM 0.33 ``SingleTypeKVCacheManager`` and its subclasses: one KV-cache group's block tables.

Each manager keeps, per request, a block table (``list[int]``, ``NULL`` for skipped positions) and
the number of its leading blocks already cached, and implements the kind's rules: which tokens
fall out of the window (``skipped_tokens``), how many blocks an allocation needs, and how a prefix
hit is searched.  ``MANAGER_CLASSES`` maps a ``GroupSpec.kind`` to its manager.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.impl.allocator.block_pool import NULL, BlockPool
from kvspec.impl.allocator.request import GroupSpec, Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeManager:
    """vLLM 0.33 ``SingleTypeKVCacheManager`` (full attention by default)."""

    def __init__(
        self, spec: GroupSpec, pool: BlockPool, gid: int, caching: bool, alignment: int, admit_cap: int | None
    ) -> None:
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
            for lst, b in zip(out, got, strict=True):
                lst.append(b)
        hit = len(out[0]) * bs
        hit -= hit % alignment
        n = cdiv(hit, bs)
        for lst in out:
            del lst[n:]
        return out, hit


class SlidingWindowManager(SingleTypeManager):
    """vLLM 0.33 ``SlidingWindowManager``."""

    def __init__(
        self, spec: GroupSpec, pool: BlockPool, gid: int, caching: bool, alignment: int, admit_cap: int | None
    ) -> None:
        super().__init__(spec, pool, gid, caching, alignment, admit_cap)
        self.window = spec.window
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
            for lst, b in zip(out, got, strict=True):
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

    def __init__(
        self, spec: GroupSpec, pool: BlockPool, gid: int, caching: bool, alignment: int, admit_cap: int | None
    ) -> None:
        super().__init__(spec, pool, gid, caching, alignment, admit_cap)
        self.chunk = spec.chunk_size

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
            for lst, b in zip(out, got, strict=True):
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

    def find_longest_cache_hit(
        self, hashes: list[bytes], max_length: int, gids: list[int], alignment: int
    ) -> tuple[list[list[int]], int]:
        raise NotImplementedError("cross-attention does not support prefix caching")


MANAGER_CLASSES: dict[str, type[SingleTypeManager]] = {
    "full": SingleTypeManager,
    "sliding_window": SlidingWindowManager,
    "chunked_local": ChunkedLocalManager,
    "cross": CrossAttentionManager,
}


def admission_cap(spec: GroupSpec, max_in_flight: int, max_model_len: int) -> int | None:
    """vLLM 0.33 ``max_admission_blocks_per_request`` (recycling specs only)."""
    if spec.kind == "sliding_window":
        return cdiv(min(spec.window - 1 + max_in_flight, max_model_len), spec.block_size) + 1
    if spec.kind == "chunked_local":
        return cdiv(min(spec.chunk_size + max_in_flight, max_model_len), spec.block_size)
    return None
