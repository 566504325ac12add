"""vLLM 0.33's free block queue as a value, for large pools (``spec.persistent``'s companion).

``LinkedQueue`` models ``FreeKVCacheBlockQueue`` (vllm/v1/core/kv_cache_utils.py), a doubly linked
list threaded through the blocks, as two ``PVec`` of links: pop from the front, push at either end
and unlink any block in ``O(blocks moved)``.  Like vLLM's list it holds each block at most once;
equal links mean equal sequences, so two queues compare by their links.

Pools of up to ``SMALL_POOL`` blocks keep the queue as a plain tuple; ``spec.block_pool`` changes
either kind through the ``queue_*`` helpers at the end of this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from kvspec.spec.persistent import CHUNK, PVec, VecOverlay

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


# --- helpers: the free queue is a tuple (small pools) or a ``LinkedQueue`` ---------------------------


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
