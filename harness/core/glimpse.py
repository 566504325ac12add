"""A glimpse: the part of a manager's state one operation of a request can change, read without
walking the pool (issue: cost flat in the pool size).

An ``Observation`` lists every block and the whole free queue, so reading and comparing it costs
O(pool).  A ``Glimpse`` holds only: the request's tables and cached counts in every group, its block
hashes, the facts (ref count, primary key, tokens it covers, secondary keys) of the blocks asked for
and of every block in those tables, the hash-map entries of the keys asked for and of those blocks'
keys, the free count, the ends of the free queue (``FREE_ENDS`` blocks each) and the number of keys
in the hash map.  A target that can read these in O(touched) offers
``glimpse(requests, blocks, keys)`` beside ``observe()``; ``Lockstep`` then compares glimpses after
most operations and whole observations every ``full_check_every`` operations and at the end of a
run (``harness.check.lockstep``), so a change outside the glimpse is still found, a few steps later.

``GlimpseView`` is the accessor set a target hands to ``build_glimpse``: the one reader of its
internals stays in the target's adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvspec.harness.core.equality import ObsDiff
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import BlockId, RequestId

FREE_ENDS = 8  # blocks read at each end of the free queue
ENV = "KVSPEC_FULL_CHECK_EVERY"
AUTO_THRESHOLD = 256  # pools up to this many blocks are checked in full after every operation
AUTO_DIVISOR = 64  # larger pools: a full check every num_blocks // AUTO_DIVISOR operations

BlockFacts = tuple[int, bytes | None, int | None, frozenset[bytes]]
"""One block: ref count (0 for the null block), primary key, tokens it covers, secondary keys."""


@dataclass(frozen=True, slots=True)
class Glimpse:
    # per group: request id -> its table (None: the group does not track the request)
    tables: tuple[dict[str, tuple[int, ...] | None], ...]
    # per group: request id -> num_cached_block (None: absent)
    num_cached_block: tuple[dict[str, int | None], ...]
    # request id -> its block hashes (None: unknown request)
    request_block_hashes: dict[str, tuple[bytes, ...] | None]
    # block id -> its facts, for the blocks asked for and those in the tables above
    blocks: dict[int, BlockFacts]
    # map key -> blocks stored under it (oldest first; () when absent), for the keys asked for and
    # the keys of the blocks above
    cached: dict[bytes, tuple[int, ...]]
    num_free: int
    free_head: tuple[int, ...]  # the first FREE_ENDS blocks of the free queue
    free_tail: tuple[int, ...]  # the last FREE_ENDS blocks
    num_cached_keys: int

    def block_keys(self) -> set[bytes]:
        """Every key (primary and secondary) the glimpsed blocks hold."""
        return _keys_of(self.blocks.values())


def _keys_of(facts: Iterable[BlockFacts]) -> set[bytes]:
    """Every key (primary and secondary) held by blocks with these facts."""
    out: set[bytes] = set()
    for _ref, key, _tokens, secondary in facts:
        if key is not None:
            out.add(key)
        out.update(secondary)
    return out


class TableLookup(Protocol):
    """A group's request id -> table map, read without side effects (``dict.get`` semantics)."""

    def get(self, rid: str, /) -> Sequence[int] | None: ...


@dataclass(frozen=True)
class GlimpseView:
    """How to read one manager in O(1) per item; ``build_glimpse`` does the rest."""

    tables: Sequence[TableLookup]  # per group: request id -> table
    num_cached: Sequence[Mapping[str, int]]  # per group: request id -> num_cached_block
    facts: Callable[[int], BlockFacts]
    cached: Callable[[bytes], tuple[int, ...]]
    num_free: int
    free_ends: Callable[[int], tuple[tuple[int, ...], tuple[int, ...]]]
    num_cached_keys: int
    hashes: Callable[[str], tuple[bytes, ...] | None]


def build_glimpse(
    view: GlimpseView, requests: Sequence[str], blocks: Collection[int], keys: Collection[bytes]
) -> Glimpse:
    """The glimpse of ``requests``, ``blocks`` and ``keys`` through ``view``."""
    tables = tuple({r: _tuple_or_none(t.get(r)) for r in requests} for t in view.tables)
    wanted = set(blocks)
    for g in tables:
        for t in g.values():
            wanted.update(t or ())
    facts = {b: view.facts(b) for b in sorted(wanted)}
    glimpse_keys = set(keys) | _keys_of(facts.values())
    head, tail = view.free_ends(FREE_ENDS)
    return Glimpse(
        tables=tables,
        num_cached_block=tuple({r: c.get(r) for r in requests} for c in view.num_cached),
        request_block_hashes={r: view.hashes(r) for r in requests},
        blocks=facts,
        cached={k: view.cached(k) for k in sorted(glimpse_keys)},
        num_free=view.num_free,
        free_head=head,
        free_tail=tail,
        num_cached_keys=view.num_cached_keys,
    )


def hashes_glimpse(rid: str, hashes: tuple[bytes, ...] | None) -> Glimpse:
    """The glimpse of a request operation (no manager call): the request's block hashes, nothing
    of the manager (``harness.check.glimpsing``)."""
    return Glimpse((), (), {rid: hashes}, {}, {}, 0, (), (), 0)


def _tuple_or_none(t: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if t is None else tuple(t)


def touched_blocks(before: KVCacheManagerState, after: KVCacheManagerState, rid: str) -> set[int]:
    """The blocks an operation of request ``rid`` can change in the spec, read from the spec's states
    before and after it: the request's tables in every group, and the ends of the free queue
    (fresh blocks are taken from its front; an eviction empties the entry of a block taken)."""
    out: set[int] = set()
    for state in (before, after):
        for g in state.groups:
            out.update(g.req_to_blocks.get(RequestId(rid), ()))
        fq = state.pool.free_queue
        out.update(fq[:FREE_ENDS])
        out.update(fq[-FREE_ENDS:])
    out.discard(0)
    return out


def block_keys(state: KVCacheManagerState, blocks: Collection[int]) -> set[bytes]:
    """Every key (primary and secondary) the spec's ``blocks`` hold in ``state``."""
    pool = state.pool
    out: set[bytes] = set()
    for b in blocks:
        key = pool.block_key[b]
        if key is not None:
            out.add(key)
        out.update(pool.secondary_keys.get(BlockId(b), ()))
    return out


def has_glimpse(target: Any) -> bool:
    """Whether ``target`` offers ``glimpse(requests, blocks, keys)``."""
    return callable(getattr(target, "glimpse", None))


def full_check_every(num_blocks: int, value: int | None = None) -> int:
    """How many operations apart whole observations are compared: ``value`` if given (the run's
    ``CheckSettings.full_check_every``, which ``KVSPEC_FULL_CHECK_EVERY`` sets at the edges), else
    auto: every operation for pools of up to ``AUTO_THRESHOLD`` blocks, every
    ``num_blocks // AUTO_DIVISOR`` above (the amortised cost of a full check then stays flat in the
    pool size)."""
    if value is not None:
        return value
    return 1 if num_blocks <= AUTO_THRESHOLD else num_blocks // AUTO_DIVISOR


def parse_full_check_every(text: str) -> int | None:
    """``auto`` (or empty) -> None; an int >= 1 -> itself; anything else raises ``ValueError`` with
    a sentence naming the variable."""
    text = text.strip()
    if text in ("", "auto"):
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or n > 1 << 30:
        raise ValueError(f"{ENV} must be 'auto' or an integer from 1 to {1 << 30}, got {text!r}")
    return n


def glimpse_differences(ref: Glimpse, tgt: Glimpse, limit: int = 8) -> list[ObsDiff]:
    """The fields in which two glimpses differ, each naming the blocks and requests involved."""
    if ref == tgt:  # every field equal (the usual case): nothing below would differ
        return []
    out: list[ObsDiff] = []
    for g, (rt, tt) in enumerate(zip(ref.tables, tgt.tables, strict=False)):
        for rid in sorted(set(rt) | set(tt)):
            if rt.get(rid) != tt.get(rid):
                blocks = tuple(sorted(set(rt.get(rid) or ()) ^ set(tt.get(rid) or ()) - {0}))
                msg = f"group {g} table of {rid!r}: expected {_fmt(rt.get(rid))}, observed {_fmt(tt.get(rid))}"
                out.append(ObsDiff("tables", msg, blocks, (rid,)))
    if len(ref.tables) != len(tgt.tables):
        out.append(ObsDiff("tables", f"{len(ref.tables)} groups expected, {len(tgt.tables)} observed"))
    for g, (rc, tc) in enumerate(zip(ref.num_cached_block, tgt.num_cached_block, strict=False)):
        for rid in sorted(set(rc) | set(tc)):
            if rc.get(rid) != tc.get(rid):
                msg = f"group {g} num_cached_block of {rid!r}: expected {rc.get(rid)}, observed {tc.get(rid)}"
                out.append(ObsDiff("num_cached_block", msg, (), (rid,)))
    for rid in sorted(set(ref.request_block_hashes) | set(tgt.request_block_hashes)):
        if ref.request_block_hashes.get(rid) != tgt.request_block_hashes.get(rid):
            out.append(ObsDiff("request_block_hashes", f"block hashes of {rid!r} differ", (), (rid,)))
    for b in sorted(set(ref.blocks) | set(tgt.blocks)):
        if ref.blocks.get(b) != tgt.blocks.get(b):
            msg = f"block {b}: expected {_facts(ref.blocks.get(b))}, observed {_facts(tgt.blocks.get(b))}"
            out.append(ObsDiff(_facts_field(ref.blocks.get(b), tgt.blocks.get(b)), msg, (b,)))
    for k in sorted(set(ref.cached) | set(tgt.cached)):
        held_ref, held_tgt = ref.cached.get(k, ()), tgt.cached.get(k, ())
        if held_ref != held_tgt:
            msg = f"hash map entry {k.hex()[:12]}: expected blocks {list(held_ref)}, observed {list(held_tgt)}"
            out.append(ObsDiff("cached", msg, tuple(sorted(set(held_ref) ^ set(held_tgt)))))
    if ref.num_free != tgt.num_free:
        out.append(ObsDiff("free_queue", f"free block count: expected {ref.num_free}, observed {tgt.num_free}"))
    for end in ("free_head", "free_tail"):
        end_ref: tuple[int, ...] = getattr(ref, end)
        end_tgt: tuple[int, ...] = getattr(tgt, end)
        if end_ref != end_tgt:
            where = "front" if end == "free_head" else "tail"
            msg = f"free queue {where}: expected {list(end_ref)}, observed {list(end_tgt)}"
            out.append(ObsDiff("free_queue", msg, tuple(sorted(set(end_ref) ^ set(end_tgt)))))
    if ref.num_cached_keys != tgt.num_cached_keys:
        out.append(
            ObsDiff("cached", f"hash map size: expected {ref.num_cached_keys} keys, observed {tgt.num_cached_keys}")
        )
    return out[:limit]


def glimpse_to_json(g: Glimpse) -> dict[str, Any]:
    """A glimpse as JSON (reports' witnesses)."""
    return {
        "tables": [{r: None if t is None else list(t) for r, t in grp.items()} for grp in g.tables],
        "num_cached_block": [dict(c) for c in g.num_cached_block],
        "blocks": {
            str(b): {
                "ref_cnt": ref,
                "key": None if key is None else key.hex(),
                "key_tokens": tokens,
                "secondary_keys": sorted(k.hex() for k in sec),
            }
            for b, (ref, key, tokens, sec) in g.blocks.items()
        },
        "cached": {k.hex(): list(ids) for k, ids in g.cached.items()},
        "num_free": g.num_free,
        "free_head": list(g.free_head),
        "free_tail": list(g.free_tail),
        "num_cached_keys": g.num_cached_keys,
    }


def _facts_field(a: BlockFacts | None, b: BlockFacts | None) -> str:
    if a is None or b is None:
        return "ref_cnt"
    return next((f for f, x, y in zip(("ref_cnt", "block_key", "block_key_tokens", "secondary_keys"), a, b) if x != y))


def _facts(f: BlockFacts | None) -> str:
    if f is None:
        return "(not read)"
    ref, key, tokens, sec = f
    keytxt = "no key" if key is None else f"key {key.hex()[:12]} over {tokens} tokens"
    return f"ref_cnt {ref}, {keytxt}" + (f", {len(sec)} secondary key(s)" if sec else "")


def _fmt(t: tuple[int, ...] | None) -> str:
    return "absent" if t is None else str(list(t))


__all__ = [
    "ENV",
    "FREE_ENDS",
    "BlockFacts",
    "Glimpse",
    "GlimpseView",
    "block_keys",
    "build_glimpse",
    "full_check_every",
    "glimpse_differences",
    "glimpse_to_json",
    "has_glimpse",
    "hashes_glimpse",
    "parse_full_check_every",
    "touched_blocks",
]
