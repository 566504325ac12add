"""Persistent containers for large pools: the state stays a value, an operation copies what it touches.

For a pool of ``N`` blocks, a tuple per field costs ``O(N)`` to rebuild on every operation; the
containers here share everything an operation leaves alone (structural sharing), so a step costs
``O(touched + sqrt N)`` whatever the pool size (``python -m harness.bench lockstep``, pool table):

- ``PVec``: a fixed-length vector cut into chunks of ``CHUNK`` entries; an update copies the chunks
  it writes and the (short) tuple of chunks.  Two vectors that share chunks compare in C, chunk by
  chunk, identity first.
- ``PMap``: a mapping spread over buckets (plain dicts) by a deterministic hash of the key; an
  update copies the buckets it writes.  Iteration order is bucket by bucket, insertion order
  within a bucket, and the same in every process.
- ``LinkedQueue``: vLLM 0.33's ``FreeKVCacheBlockQueue`` (a doubly linked list threaded through the
  blocks) as two ``PVec`` of links: pop from the front, push at either end and unlink any block
  in ``O(blocks moved)``.  Like vLLM's list it holds each block at most once; equal links mean
  equal sequences, so two queues compare by their links.

Pools of up to ``SMALL_POOL`` blocks keep plain tuples and dicts (cheaper at that size, and the
fuzzing families' pools are small); ``spec.block_pool`` reads and writes both kinds through the
helpers at the end of this module.  Each container also reads like the tuple it replaces (length,
index, iteration, equality with a tuple), so predicates and reports need not care which they got.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

SMALL_POOL = 256
"""Pools of at most this many blocks use tuples and dicts; larger ones the persistent containers."""

CHUNK = 256
"""Entries per ``PVec`` chunk, and the bucket count's scale for ``PMap``."""


class PVec(Sequence[T]):
    """A persistent fixed-length vector: ``set`` returns a new vector sharing untouched chunks."""

    __slots__ = ("_chunks", "_n")

    def __init__(self, chunks: tuple[tuple[T, ...], ...], n: int) -> None:
        self._chunks, self._n = chunks, n

    @classmethod
    def filled(cls, value: T, n: int) -> PVec[T]:
        """``n`` copies of ``value``; every full chunk is the same tuple object."""
        full, rest = divmod(n, CHUNK)
        chunk = (value,) * CHUNK
        return cls((chunk,) * full + (((value,) * rest,) if rest else ()), n)

    @classmethod
    def of(cls, items: Iterable[T]) -> PVec[T]:
        flat = tuple(items)
        return cls(tuple(flat[i : i + CHUNK] for i in range(0, len(flat), CHUNK)), len(flat))

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[T, ...]: ...
    def __getitem__(self, i: int | slice) -> T | tuple[T, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]  # whole-vector reads (reports, full checks) only
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} entries")
        return self._chunks[i // CHUNK][i % CHUNK]

    def __iter__(self) -> Iterator[T]:
        return itertools.chain.from_iterable(self._chunks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PVec):
            return self._n == other._n and self._chunks == other._chunks
        if isinstance(other, (tuple, list)):
            return self._n == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._chunks)

    def __repr__(self) -> str:
        return f"PVec({list(self)!r})"

    def set(self, updates: Mapping[int, T]) -> PVec[T]:
        """A new vector with ``updates`` (index -> value) written; chunks not written are shared."""
        if not updates:
            return self
        chunks = list(self._chunks)
        edited: dict[int, list[T]] = {}
        for i, value in updates.items():
            assert 0 <= i < self._n, f"index {i} out of range for {self._n} entries"
            c = i // CHUNK
            if c not in edited:
                edited[c] = list(chunks[c])
            edited[c][i % CHUNK] = value
        for c, entries in edited.items():
            chunks[c] = tuple(entries)
        return PVec(tuple(chunks), self._n)

    def changed_indices(self, other: PVec[T]) -> list[int]:
        """Indices where the two vectors differ, read only in the chunks that are not shared."""
        assert self._n == other._n
        out: list[int] = []
        for c, (mine, theirs) in enumerate(zip(self._chunks, other._chunks)):
            if mine is not theirs and mine != theirs:
                out.extend(c * CHUNK + j for j, (x, y) in enumerate(zip(mine, theirs)) if x != y)
        return out


def _bucket_of(key: object, mask: int) -> int:
    if isinstance(key, int):
        return key & mask
    assert isinstance(key, bytes), f"PMap keys are ints or bytes, not {type(key).__name__}"
    return zlib.crc32(key) & mask


class PMap(Mapping[K, V]):
    """A persistent mapping over ``2**k`` dict buckets: ``update`` copies the buckets it writes."""

    __slots__ = ("_buckets", "_n")

    def __init__(self, buckets: tuple[dict[K, V], ...], n: int) -> None:
        self._buckets, self._n = buckets, n

    @classmethod
    def empty(cls, num_blocks: int) -> PMap[K, V]:
        """An empty map sized for a pool of ``num_blocks``: about ``CHUNK`` keys per bucket when full."""
        num_buckets = 1
        while num_buckets * CHUNK < num_blocks:
            num_buckets *= 2
        return cls(tuple({} for _ in range(num_buckets)), 0)

    def __getitem__(self, key: K) -> V:
        return self._buckets[_bucket_of(key, len(self._buckets) - 1)][key]

    def get(self, key: K, default: Any = None) -> Any:
        return self._buckets[_bucket_of(key, len(self._buckets) - 1)].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[_bucket_of(key, len(self._buckets) - 1)]

    def __iter__(self) -> Iterator[K]:
        return itertools.chain.from_iterable(self._buckets)

    def __len__(self) -> int:
        return self._n

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PMap) and len(other._buckets) == len(self._buckets):
            return self._n == other._n and self._buckets == other._buckets
        if isinstance(other, Mapping):
            return self._n == len(other) and self.to_dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.items())))

    def __repr__(self) -> str:
        return f"PMap({dict(self.items())!r})"

    def to_dict(self) -> dict[K, V]:
        """The whole map as one dict (bucket by bucket), built in C."""
        return dict(itertools.chain.from_iterable(b.items() for b in self._buckets))

    def update(self, changes: Mapping[K, V | None]) -> PMap[K, V]:
        """A new map with ``changes`` applied (a value of None deletes the key)."""
        if not changes:
            return self
        mask = len(self._buckets) - 1
        buckets = list(self._buckets)
        edited: set[int] = set()
        n = self._n
        for key, value in changes.items():
            c = _bucket_of(key, mask)
            if c not in edited:
                buckets[c] = dict(buckets[c])
                edited.add(c)
            bucket = buckets[c]
            if value is None:
                n -= bucket.pop(key, _MISSING) is not _MISSING
            else:
                n += key not in bucket
                bucket[key] = value
        return PMap(tuple(buckets), n)


_MISSING = object()
NONE = -1  # LinkedQueue: no neighbour (the queue's ends)
OUT = -2  # LinkedQueue: the block is not queued


class LinkedQueue(Sequence[int]):
    """vLLM 0.33 ``FreeKVCacheBlockQueue`` as a value: block ids linked front to tail.

    ``prev[b]`` / ``next[b]`` are b's neighbours (``NONE`` at the ends, ``OUT`` when b is not
    queued).  Reads like a tuple of the queued ids from the front (handed out first) to the tail.
    """

    __slots__ = ("_prev", "_next", "_head", "_tail", "_n")

    def __init__(self, prev: PVec[int], nxt: PVec[int], head: int, tail: int, n: int) -> None:
        self._prev, self._next, self._head, self._tail, self._n = prev, nxt, head, tail, n

    @classmethod
    def of(cls, ids: Iterable[int], num_blocks: int) -> LinkedQueue:
        order = list(ids)
        assert len(set(order)) == len(order), "a linked queue holds each block at most once"
        assert all(0 <= b < num_blocks for b in order), f"a queued id is outside 0..{num_blocks - 1}"
        prev, nxt = [OUT] * num_blocks, [OUT] * num_blocks
        for a, b in zip(order, order[1:]):
            nxt[a], prev[b] = b, a
        head, tail = (order[0], order[-1]) if order else (NONE, NONE)
        if order:
            prev[head], nxt[tail] = NONE, NONE
        return cls(PVec.of(prev), PVec.of(nxt), head, tail, len(order))

    # --- reading, like a tuple ------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __contains__(self, b: object) -> bool:
        return isinstance(b, int) and 0 <= b < len(self._prev) and self._prev[b] != OUT

    def __iter__(self) -> Iterator[int]:
        b, nxt = self._head, self._next
        if self._n > CHUNK:  # a whole walk: read the links out once (in C), then follow them
            nxt = list(nxt)  # type: ignore[assignment]
        for _ in range(self._n):
            yield b
            b = nxt[b]

    def __reversed__(self) -> Iterator[int]:
        b, prev = self._tail, self._prev
        if self._n > CHUNK:
            prev = list(prev)  # type: ignore[assignment]
        for _ in range(self._n):
            yield b
            b = prev[b]

    def first(self, k: int) -> tuple[int, ...]:
        """The first ``k`` queued ids (fewer if the queue is shorter)."""
        out, b = [], self._head
        for _ in range(min(k, self._n)):
            out.append(b)
            b = self._next[b]
        return tuple(out)

    def last(self, k: int) -> tuple[int, ...]:
        """The last ``k`` queued ids, in queue order."""
        out, b = [], self._tail
        for _ in range(min(k, self._n)):
            out.append(b)
            b = self._prev[b]
        return tuple(reversed(out))

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            if i.step is None and (i.start or 0) == 0 and i.stop is not None and i.stop >= 0:
                return self.first(i.stop)
            if i.step is None and i.stop is None and i.start is not None and i.start < 0:
                return self.last(-i.start)
            return tuple(self)[i]
        if not -self._n <= i < self._n:
            raise IndexError(f"index {i} out of range for a queue of {self._n}")
        return self.first(i + 1)[-1] if i >= 0 else self.last(-i)[0]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LinkedQueue):
            return (self._n, self._head, self._tail) == (other._n, other._head, other._tail) and (
                self._next == other._next and self._prev == other._prev
            )
        if isinstance(other, (tuple, list)):
            return self._n == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._n, self._head, self._next))

    def __add__(self, other: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self) + tuple(other)

    def __radd__(self, other: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"LinkedQueue({list(self)!r})"

    # --- operations -------------------------------------------------------------------------------

    def popleft(self, k: int) -> tuple[LinkedQueue, tuple[int, ...]]:
        """vLLM ``popleft_n``: the first ``k`` ids leave the queue."""
        assert 0 <= k <= self._n, f"cannot pop {k} of {self._n} queued blocks"
        if k == 0:
            return self, ()
        taken = self.first(k)
        head = self._next[taken[-1]]
        gone = dict.fromkeys(taken, OUT)
        prev = self._prev.set({**gone, head: NONE} if head != NONE else gone)
        nxt = self._next.set(gone)
        return LinkedQueue(prev, nxt, head, self._tail if head != NONE else NONE, self._n - k), taken

    def remove(self, blocks: Iterable[int]) -> LinkedQueue:
        """vLLM ``remove``: unlink each of ``blocks`` (each must be queued) from wherever it sits."""
        prev: VecOverlay[int] = VecOverlay(self._prev)
        nxt: VecOverlay[int] = VecOverlay(self._next)
        head, tail, n = self._head, self._tail, self._n
        for b in blocks:
            p, q = prev[b], nxt[b]
            assert p != OUT, f"block {b} is not in the free queue"
            if p == NONE:
                head = q
            else:
                nxt[p] = q
            if q == NONE:
                tail = p
            else:
                prev[q] = p
            prev[b] = nxt[b] = OUT
            n -= 1
        return LinkedQueue(prev.freeze(), nxt.freeze(), head, tail, n)

    def push(self, front: Sequence[int], back: Sequence[int]) -> LinkedQueue:
        """``front`` (in order) before the current front and ``back`` (in order) after the tail;
        none of them may be queued already (vLLM's list cannot hold a block twice)."""
        new = [*front, *back]
        if not new:
            return self
        assert len(set(new)) == len(new), f"blocks {new} pushed twice"
        for b in new:
            assert self._prev[b] == OUT, f"block {b} is already in the free queue"
        nf = len(front)
        # Segments (first, last): each new block alone, the current queue as one segment.
        segs = [(b, b) for b in new[:nf]] + ([(self._head, self._tail)] if self._n else []) + [(b, b) for b in new[nf:]]
        prev: dict[int, int] = {segs[0][0]: NONE}
        nxt: dict[int, int] = {segs[-1][1]: NONE}
        for (_, last), (first, _) in zip(segs, segs[1:]):
            nxt[last] = first
            prev[first] = last
        return LinkedQueue(self._prev.set(prev), self._next.set(nxt), segs[0][0], segs[-1][1], self._n + len(new))


# --- helpers: the pool's fields are tuples/dicts (small pools) or the containers above --------------


def vec_set(vec: Any, updates: Mapping[int, T]) -> Any:
    """``vec`` (a tuple or a ``PVec``) with ``updates`` written."""
    if isinstance(vec, PVec):
        return vec.set(updates)
    if not updates:
        return vec
    out = list(vec)
    for i, value in updates.items():
        out[i] = value
    return tuple(out)


def vec_changed(before: Any, after: Any) -> list[int]:
    """Indices where two equally long vectors (tuples or ``PVec``) differ."""
    if before is after:
        return []
    if isinstance(before, PVec) and isinstance(after, PVec):
        return before.changed_indices(after)  # shared chunks skipped, the rest compared in C first
    if before == after:
        return []
    return [i for i, (x, y) in enumerate(zip(before, after)) if x != y]


def map_update(mapping: Mapping[K, V], changes: Mapping[K, V | None]) -> Mapping[K, V]:
    """``mapping`` (a dict or a ``PMap``) with ``changes`` applied; None deletes."""
    if isinstance(mapping, PMap):
        return mapping.update(changes)
    if not changes:
        return mapping
    out = dict(mapping)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def queue_popleft(queue: Any, k: int) -> tuple[Any, tuple[int, ...]]:
    """The queue (a tuple or a ``LinkedQueue``) without its first ``k`` ids, and those ids."""
    if isinstance(queue, LinkedQueue):
        return queue.popleft(k)
    return queue[k:], queue[:k]


def queue_remove(queue: Any, leaving: set[int]) -> Any:
    """The queue without the ids of ``leaving``, order kept.  On a tuple a few ids are found by
    ``tuple.index`` and cut out (the scans run in C), many by one filtering pass."""
    if not leaving:
        return queue
    if isinstance(queue, LinkedQueue):
        return queue.remove(leaving)
    if len(leaving) > 16:
        return tuple(b for b in queue if b not in leaving)
    out: list[int] = []
    start = 0
    for i in sorted(queue.index(b) for b in leaving if b in queue):
        out.extend(queue[start:i])
        start = i + 1
    out.extend(queue[start:])
    return tuple(out)


def queue_push(queue: Any, front: Sequence[int], back: Sequence[int]) -> Any:
    """``front + queue + back``."""
    if isinstance(queue, LinkedQueue):
        return queue.push(front, back)
    return tuple(front) + queue + tuple(back) if front or back else queue


class VecOverlay(Generic[T]):
    """Writes to a vector (tuple or ``PVec``) kept aside for one operation, then applied at once."""

    __slots__ = ("base", "writes")

    def __init__(self, base: Any) -> None:
        self.base = base
        self.writes: dict[int, T] = {}

    def __getitem__(self, i: int) -> T:
        w = self.writes
        return w[i] if i in w else self.base[i]

    def __setitem__(self, i: int, value: T) -> None:
        self.writes[i] = value

    def freeze(self) -> Any:
        return vec_set(self.base, self.writes)


class MapOverlay(Generic[K, V]):
    """Writes and deletions to a mapping (dict or ``PMap``) kept aside for one operation."""

    __slots__ = ("base", "writes")

    def __init__(self, base: Mapping[K, V]) -> None:
        self.base: Mapping[K, V] = base
        self.writes: dict[K, V | None] = {}

    def get(self, key: K, default: Any = None) -> Any:
        if key in self.writes:
            value = self.writes[key]
            return default if value is None else value
        return self.base.get(key, default)

    def __setitem__(self, key: K, value: V) -> None:
        assert value is not None
        self.writes[key] = value

    def pop(self, key: K, default: Any = None) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            return default
        self.writes[key] = None
        return value

    def freeze(self) -> Mapping[K, V]:
        return map_update(self.base, self.writes)
