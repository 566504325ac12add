"""Claims about the block pool: every operation preserves the pool invariants.

Invariants (vLLM 0.33 ``BlockPool``; docs/semantics.md §9.1-§9.5):

* conservation: ``free + |{b != null : ref_cnt[b] > 0}| == N - 1``;
* a non-null block is in the free queue iff its ``ref_cnt`` is 0 (and ``ref_cnt >= 0``);
* the null block (id 0) is never free and never hashed;
* ``ref_cnt[b]`` equals the number of table references to ``b``.

Two claims:

* ``pool.invariants_inductive``: an abstract encoding over Z3 arrays indexed by block id, for any
  number of blocks ``N`` (unbounded).  Operations are taken one block at a time, which is how the
  spec's list operations act (``touch`` and ``free_blocks`` loop over their blocks and each step
  only reads and writes that block; ``get_new_blocks(n)`` pops n front blocks one after another;
  the free queue's *order* is not modelled, only membership and length).  Each step is proven to
  preserve the invariants: the invariants are assumed at an arbitrary block ``x`` and at the
  operated block ``b`` and proven at ``x`` after the step (the step changes no other entry), and
  conservation is carried by a count of referenced blocks updated by the step's own change (the
  counts are linked to the arrays only through ``counts_cover``: a count that includes the
  operated block is positive).
* ``pool.invariants_bounded``: the real ``spec.block_pool`` functions on every pool reachable from
  ``init_block_pool(N)`` for ``N`` up to 4 (3 usable blocks), with up to 2 references per block
  and two possible keys, under get_new_blocks(k), touch, free_blocks (one block and whole
  two-block tables, both orders), cache_full_blocks, evict_blocks and reset_prefix_cache; the
  invariants above, plus queue entries distinct, the hash map agreeing with the blocks' keys, and
  blocks handed out by get_new_blocks being unhashed, hold in every reachable state (breadth-first
  until no new state appears).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from kvspec.harness.proofs.core import COUNTEREXAMPLE, PROVEN, UNKNOWN, Claim, Outcome
from kvspec.spec import block_pool as bp
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.releases.profile import BASE
from kvspec.spec.types import BlockHash, BlockId, GroupId, make_block_key

# --- abstract encoding ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolVars:
    """Symbolic pool: ``ref`` (ref_cnt), ``inq`` (in the free queue), ``hashed``, ``refs`` (table
    references), ``nfree`` (queue length), ``nused`` (count of non-null blocks with ref > 0), ``N``."""

    ref: z3.ArrayRef
    inq: z3.ArrayRef
    hashed: z3.ArrayRef
    refs: z3.ArrayRef
    nfree: z3.ArithRef
    nused: z3.ArithRef
    N: z3.ArithRef

    @staticmethod
    def make(tag: str) -> PoolVars:
        INT, BOOL = z3.IntSort(), z3.BoolSort()
        return PoolVars(
            z3.Array(f"ref{tag}", INT, INT),
            z3.Array(f"inq{tag}", INT, BOOL),
            z3.Array(f"hashed{tag}", INT, BOOL),
            z3.Array(f"refs{tag}", INT, INT),
            z3.Int(f"nfree{tag}"),
            z3.Int(f"nused{tag}"),
            z3.Int(f"N{tag}"),
        )


def block_invariant(s: PoolVars, x: z3.ArithRef) -> z3.BoolRef:
    """The per-block invariants at block ``x``."""
    real = z3.And(x >= 1, x < s.N)
    return z3.And(
        z3.Implies(real, z3.And(s.inq[x] == (s.ref[x] == 0), s.ref[x] >= 0, s.ref[x] == s.refs[x])),
        z3.Implies(x == 0, z3.And(z3.Not(s.inq[0]), z3.Not(s.hashed[0]))),
    )


def counts_cover(s: PoolVars, b: z3.ArithRef) -> z3.BoolRef:
    """What ``nfree = |{queued}|`` and ``nused = |{real b : ref > 0}|`` say about one block ``b``:
    a count that includes ``b`` is at least 1 (the counts themselves are not expanded)."""
    real = z3.And(b >= 1, b < s.N)
    return z3.And(z3.Implies(s.inq[b], s.nfree >= 1), z3.Implies(z3.And(real, s.ref[b] > 0), s.nused >= 1))


def global_invariant(s: PoolVars) -> z3.BoolRef:
    return z3.And(s.N >= 1, s.nfree >= 0, s.nused >= 0, s.nfree + s.nused == s.N - 1)


def _used(s: PoolVars, b: z3.ArithRef) -> z3.ArithRef:
    return z3.If(s.ref[b] > 0, 1, 0)


def _with(
    s: PoolVars, b: z3.ArithRef, ref: Any = None, inq: Any = None, hashed: Any = None, refs: Any = None, dfree: Any = 0
) -> PoolVars:
    """``s`` with block ``b``'s entries replaced; ``nused`` follows the change of ``ref[b] > 0``."""
    new_ref = s.ref if ref is None else z3.Store(s.ref, b, ref)
    t = PoolVars(
        new_ref,
        s.inq if inq is None else z3.Store(s.inq, b, inq),
        s.hashed if hashed is None else z3.Store(s.hashed, b, hashed),
        s.refs if refs is None else z3.Store(s.refs, b, refs),
        s.nfree + dfree,
        s.nused,
        s.N,
    )
    return PoolVars(t.ref, t.inq, t.hashed, t.refs, t.nfree, s.nused - _used(s, b) + _used(t, b), s.N)


def enc_touch(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """``touch([b])`` as a prefix hit does it: the table gains a reference; a block at 0 leaves the queue."""
    leaving = s.ref[b] == 0
    t = _with(s, b, ref=s.ref[b] + 1, inq=z3.BoolVal(False), refs=s.refs[b] + 1, dfree=z3.If(leaving, -1, 0))
    return z3.And(b >= 1, b < s.N), t


def enc_get_new_block(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """One step of ``get_new_blocks``: the front block ``b`` (some queued block) loses its hash,
    leaves the queue and gets ``ref_cnt = 1`` and one table reference."""
    t = _with(s, b, ref=z3.IntVal(1), inq=z3.BoolVal(False), hashed=z3.BoolVal(False), refs=s.refs[b] + 1, dfree=-1)
    return z3.And(b >= 0, b < s.N, s.inq[b], s.nfree >= 1), t


def enc_free(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """One step of ``free_blocks``: a table drops its reference to ``b``; at 0 it rejoins the queue."""
    joins = s.ref[b] - 1 == 0
    t = _with(s, b, ref=s.ref[b] - 1, inq=joins, refs=s.refs[b] - 1, dfree=z3.If(joins, 1, 0))
    return z3.And(b >= 1, b < s.N, s.refs[b] >= 1), t


def enc_cache(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """``cache_full_blocks`` on a table entry ``b``: null entries are skipped, others get a key."""
    return z3.And(b >= 0, b < s.N, s.refs[b] >= 1), _with(s, b, hashed=z3.If(b == 0, s.hashed[b], True))


def enc_evict(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """``evict_blocks({b})``: only the hash goes."""
    return z3.And(b >= 0, b < s.N), _with(s, b, hashed=z3.BoolVal(False))


def enc_reset(s: PoolVars, b: z3.ArithRef) -> tuple[z3.BoolRef, PoolVars]:
    """``reset_prefix_cache``: when all usable blocks are free, every hash goes; else no change."""
    ok = s.nfree == s.N - 1
    hashed = z3.If(ok, z3.K(z3.IntSort(), z3.BoolVal(False)), s.hashed)
    return z3.BoolVal(True), PoolVars(s.ref, s.inq, hashed, s.refs, s.nfree, s.nused, s.N)


ENCODED_OPS: dict[str, Callable[[PoolVars, z3.ArithRef], tuple[z3.BoolRef, PoolVars]]] = {
    "touch": lambda s, b: enc_touch(s, b),
    "get_new_blocks": lambda s, b: enc_get_new_block(s, b),
    "free_blocks": lambda s, b: enc_free(s, b),
    "cache_full_blocks": lambda s, b: enc_cache(s, b),
    "evict_blocks": lambda s, b: enc_evict(s, b),
    "reset_prefix_cache": lambda s, b: enc_reset(s, b),
}


def check_inductive(timeout_s: float) -> Outcome:
    s = PoolVars.make("")
    b, x = z3.Ints("b x")
    for name, op in ENCODED_OPS.items():
        pre, t = op(s, b)
        for goal, post in (("per-block invariants at x", block_invariant(t, x)), ("conservation", global_invariant(t))):
            solver = z3.Solver()
            solver.set(timeout=max(1, int(timeout_s * 1000)))
            solver.add(
                global_invariant(s), block_invariant(s, x), block_invariant(s, b), counts_cover(s, b), pre, z3.Not(post)
            )
            answer = solver.check()
            if answer == z3.sat:
                m = solver.model()
                model = {
                    v: m.eval(z3.Int(v) if v != "op" else z3.Int("b"), model_completion=True).as_long()
                    for v in ("b", "x", "nfree", "nused", "N")
                }
                return Outcome(COUNTEREXAMPLE, f"{name}: {goal}", {"op": name, **model})
            if answer == z3.unknown:
                return Outcome(UNKNOWN, f"{name}: {goal}", detail=solver.reason_unknown())
    return Outcome(PROVEN)


# --- bounded check on the real spec pool ---------------------------------------------------------

MAX_POOL_BLOCKS = 4
MAX_REFS = 2
KEYS = (make_block_key(BlockHash(b"h1" * 16), GroupId(0)), make_block_key(BlockHash(b"h2" * 16), GroupId(0)))


def pool_violation(pool: bp.BlockPool, refs: tuple[int, ...]) -> str:
    """'' when the invariants hold for ``pool`` with ``refs[b]`` table references, else which fails."""
    N = pool.num_blocks
    queue = pool.free_queue
    if len(set(queue)) != len(queue):
        return "free queue holds a block twice"
    if 0 in queue:
        return "the null block is free"
    if pool.block_key[0] is not None:
        return "the null block is hashed"
    used = sum(1 for b in range(1, N) if pool.ref_cnt[b] > 0)
    if len(queue) + used != N - 1:
        return f"conservation: {len(queue)} free + {used} used != {N - 1}"
    for b in range(1, N):
        if (b in queue) != (pool.ref_cnt[b] == 0) or pool.ref_cnt[b] < 0:
            return f"block {b}: in queue {b in queue} but ref_cnt {pool.ref_cnt[b]}"
        if pool.ref_cnt[b] != refs[b]:
            return f"block {b}: ref_cnt {pool.ref_cnt[b]} but {refs[b]} references"
    for key, holders in pool.cached.items():
        if not holders or any(pool.block_key[h] != key for h in holders):
            return f"hash map entry {key!r} disagrees with its blocks"
    for b in range(N):
        if pool.block_key[b] is not None and b not in pool.cached.get(pool.block_key[b], ()):  # type: ignore[arg-type]
            return f"block {b} is hashed but not in the map"
    return ""


class FreshBlockHashed(AssertionError):
    pass


def _successors(pool: bp.BlockPool, refs: tuple[int, ...]) -> list[tuple[str, bp.BlockPool, tuple[int, ...]]]:
    N = pool.num_blocks
    out: list[tuple[str, bp.BlockPool, tuple[int, ...]]] = []

    def add_refs(blocks: tuple[int, ...], delta: int) -> tuple[int, ...]:
        r = list(refs)
        for b in blocks:
            r[b] += delta
        return tuple(r)

    for k in range(1, len(pool.free_queue) + 1):
        new_pool, taken = bp.get_new_blocks(pool, k)
        stale = [b for b in taken if new_pool.block_key[b] is not None]
        if stale:  # vLLM 0.33 get_new_blocks evicts: fresh blocks carry no hash
            raise FreshBlockHashed(f"get_new_blocks({k}) returned hashed block(s) {stale}")
        if all(refs[b] < MAX_REFS for b in taken):
            out.append((f"get_new_blocks({k})", new_pool, add_refs(taken, +1)))
    for b in range(1, N):
        if (pool.block_key[b] is not None or refs[b] > 0) and refs[b] < MAX_REFS:
            out.append((f"touch([{b}])", bp.touch(pool, [BlockId(b)]), add_refs((b,), +1)))
        if refs[b] > 0:
            out.append((f"free_blocks([{b}])", bp.free_blocks(pool, [BlockId(b)]), add_refs((b,), -1)))
            for c in range(1, N):
                if c != b and refs[c] > 0:
                    out.append(
                        (
                            f"free_blocks([{b}, {c}])",
                            bp.free_blocks(pool, [BlockId(b), BlockId(c)]),
                            add_refs((b, c), -1),
                        )
                    )
            if pool.block_key[b] is None:
                for key in KEYS:
                    h = key[:-4]
                    new = bp.cache_full_blocks(pool, [0], [h], [BlockId(b)], 0, 1, 1, GroupId(0))  # type: ignore[list-item]
                    out.append((f"cache_full_blocks([{b}], {h[:2]!r})", new, refs))
        out.append((f"evict_blocks([{b}])", bp.evict_blocks(pool, [b]), refs))
    new_pool, _ = bp.reset_prefix_cache(pool)
    out.append(("reset_prefix_cache()", new_pool, refs))
    return out


def _state_key(pool: bp.BlockPool, refs: tuple[int, ...]) -> Any:
    return (pool.ref_cnt, pool.block_key, pool.free_queue, tuple(sorted(pool.cached.items())), refs)


def check_bounded(timeout_s: float) -> Outcome:
    total = 0
    for N in range(1, MAX_POOL_BLOCKS + 1):
        for profile in (BASE, FREE_ORDER_0_20):
            start = bp.init_block_pool(N, enable_caching=True, profile=profile)
            seen = {_state_key(start, (0,) * N)}
            frontier: deque[tuple[bp.BlockPool, tuple[int, ...], tuple[str, ...]]] = deque([(start, (0,) * N, ())])
            while frontier:
                pool, refs, path = frontier.popleft()
                try:
                    successors = _successors(pool, refs)
                except AssertionError as e:  # the spec's own assertions, or a hashed fresh block
                    return Outcome(
                        COUNTEREXAMPLE,
                        "operations succeed and hand out unhashed blocks",
                        {"num_blocks": N, "profile": profile.name, "ops": list(path)},
                        str(e),
                    )
                for label, new_pool, new_refs in successors:
                    wrong = pool_violation(new_pool, new_refs)
                    if wrong:
                        return Outcome(
                            COUNTEREXAMPLE,
                            "every reachable pool satisfies the invariants",
                            {"num_blocks": N, "profile": profile.name, "ops": list(path + (label,))},
                            wrong,
                        )
                    key = _state_key(new_pool, new_refs)
                    if key not in seen:
                        seen.add(key)
                        total += 1
                        frontier.append((new_pool, new_refs, path + (label,)))
    return Outcome(PROVEN, detail=f"{total} reachable pools checked")


CLAIMS = [
    Claim(
        "pool.invariants_inductive",
        "touch, get_new_blocks, free_blocks, cache, evict and reset each preserve conservation, "
        "free <=> ref_cnt 0, null never free or hashed, and ref_cnt == references (any pool size).",
        (
            "the invariants hold before the step",
            "a freed block is referenced by the freeing table",
            "get_new_blocks takes a queued block",
            "queue order is not modelled",
        ),
        check_inductive,
    ),
    Claim(
        "pool.invariants_bounded",
        "On the real spec pool, every state reachable by the six operations satisfies the pool invariants.",
        ("touch only hashed or referenced blocks (prefix hits)", "free only referenced blocks"),
        check_bounded,
        bound="num_blocks <= 4, <= 2 references per block, 2 keys, both free-queue profiles",
    ),
]
