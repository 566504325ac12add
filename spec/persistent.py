"""Persistent containers for large pools: the state stays a value, an operation copies what it touches.

For a pool of ``N`` blocks, a tuple per field costs ``O(N)`` to rebuild on every operation; the
containers here share everything an operation leaves alone (structural sharing), so a step costs
``O(touched + sqrt N)`` whatever the pool size (``python -m kvspec.harness.bench lockstep``, pool table):

- ``PVec``: a fixed-length vector cut into chunks of ``CHUNK`` entries; an update copies the chunks
  it writes and the (short) tuple of chunks.  Two vectors that share chunks compare in C, chunk by
  chunk, identity first.
- ``PMap``: a mapping spread over buckets (plain dicts) by a deterministic hash of the key; an
  update copies the buckets it writes.  Iteration order is bucket by bucket, insertion order
  within a bucket, and the same in every process.

The free queue, vLLM's linked list threaded through the blocks, is two ``PVec`` of links
(``spec.linked_queue``).  Pools of up to ``SMALL_POOL`` blocks keep plain tuples and dicts (cheaper
at that size, and the fuzzing families' pools are small); ``spec.block_pool`` reads and writes both
kinds through the helpers at the end of this module.  Each container also reads like the tuple it
replaces (length, index, iteration, equality with a tuple), so predicates and reports need not care
which they got.
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
