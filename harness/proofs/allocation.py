"""Claims about ``allocate_slots`` and ``get_computed_blocks`` arithmetic (vLLM 0.33.0).

Every quantity below is computed by the spec's own formulas in ``spec.arith``, called on Z3 integer
terms.  Where the spec's managers combine those formulas (a table is ``[null] * skipped + hits``,
external blocks are appended before new ones), the composition is written out once in
``admission_allocation`` / ``running_allocation`` and documented step by step against vLLM 0.33
``KVCacheManager.allocate_slots`` and ``SingleTypeKVCacheManager``; the harness checks the real
spec against those steps on concrete traces.

One group at a time: the three attention kinds that allocate per token (full, sliding window,
chunked local) are each proven.  Premises name what the scheduler guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import z3

from kvspec.harness.proofs.core import Claim, Outcome, prove_goals
from kvspec.harness.proofs.report import allocation_trace, hit_cap_trace, slot_targets_trace
from kvspec.spec import arith

KINDS = ("full", "sliding_window", "chunked_local")


def num_skipped_tokens(kind: str, num_computed_tokens: Any, span: Any) -> Any:
    """``get_num_skipped_tokens`` of the group kind (``span`` = window W or chunk C)."""
    if kind == "full":
        return 0
    if kind == "sliding_window":
        return arith.get_sliding_window_num_skipped_tokens(num_computed_tokens, span)
    return arith.get_chunked_local_num_skipped_tokens(num_computed_tokens, span)


@dataclass(frozen=True)
class Vars:
    """The symbolic inputs of one ``allocate_slots`` call on one group."""

    c: z3.ArithRef  # request.num_computed_tokens
    hits: z3.ArithRef  # len(new_computed_blocks) (block-aligned hit: new_comp = hits * bs)
    e: z3.ArithRef  # num_external_computed_tokens
    n: z3.ArithRef  # num_new_tokens (verified tokens + drafts)
    la: z3.ArithRef  # num_lookahead_tokens
    M: z3.ArithRef  # max_model_len
    bs: z3.ArithRef  # block_size
    span: z3.ArithRef  # sliding window W / attention chunk C (unused for full)
    T: z3.ArithRef  # request.num_tokens
    held: z3.ArithRef  # table length before the call
    ev: z3.ArithRef  # hits with ref_cnt == 0 among those adopted (touch takes them off the queue)
    cached: z3.ArithRef  # num_cached_block before the call
    hashes: z3.ArithRef  # len(request.block_hashes)

    @staticmethod
    def make() -> Vars:
        return Vars(*z3.Ints("c hits e n la M bs span T held ev cached hashes"))

    def all(self) -> list[z3.ArithRef]:
        return [
            self.c,
            self.hits,
            self.e,
            self.n,
            self.la,
            self.M,
            self.bs,
            self.span,
            self.T,
            self.held,
            self.ev,
            self.cached,
            self.hashes,
        ]

    def common_premises(self) -> list[z3.BoolRef]:
        """Counts are non-negative, sizes positive, and a request fits the model."""
        v = self
        return [
            v.bs >= 1,
            v.span >= 1,
            v.M >= 1,
            v.c >= 0,
            v.hits >= 0,
            v.e >= 0,
            v.n >= 0,
            v.la >= 0,
            v.T >= 1,
            v.T <= v.M,
            v.held >= 0,
            v.ev >= 0,
            v.cached >= 0,
        ]

    def admission_premises(self) -> list[z3.BoolRef]:
        """A request being admitted: owns nothing, its hit is below the cap, and local + external
        computed tokens lie within its tokens; at least one token is scheduled (step 1)."""
        v = self
        new_comp = v.hits * v.bs
        return self.common_premises() + [
            v.c == 0,
            v.held == 0,
            new_comp <= arith.get_max_cache_hit_length(v.T),
            new_comp + v.e <= v.T,
            v.n + v.e + new_comp >= 1,
            v.ev <= v.hits,
        ]

    def running_premises(self) -> list[z3.BoolRef]:
        """A running request: no new hits or external tokens; its table satisfies the bound
        (induction hypothesis) and covers its computed tokens; it computed at most its tokens."""
        v = self
        return self.common_premises() + [
            v.hits == 0,
            v.e == 0,
            v.ev == 0,
            v.n >= 1,
            v.held <= arith.cdiv(v.M, v.bs),
            v.c <= v.T,
            v.c <= v.held * v.bs,
        ]


@dataclass(frozen=True)
class Allocation:
    predicted: Any  # the capacity check's k
    fresh: Any  # blocks get_new_blocks hands out (external + new)
    taken: Any  # fresh + hits touched off the free queue
    table_len: Any  # len(req_to_blocks[req]) after success
    need_slot: Any


def admission_allocation(kind: str, v: Vars) -> Allocation:
    """vLLM 0.33 ``allocate_slots`` for a request with no blocks, steps 3-12, one group.

    - step 3/7: ``compute_slot_targets`` (clamps);
    - step 9: predictor ``get_num_new_blocks_admission(required, skipped, len(hits) + held, ev)``
      with the skip computed from the *unclamped* local + external count;
    - step 11: ``add_local_computed_blocks`` makes the table ``[null] * skipped + hits[skipped:]``
      (length ``max(skipped, len(hits))``) and touches the ``ev`` evictable hits among those kept;
      ``allocate_external_computed_blocks`` clips the external tokens by the skip and, if some
      remain, appends ``get_num_external_blocks_to_allocate`` fresh blocks;
    - step 12: ``allocate_new_blocks`` appends ``get_num_new_blocks_to_allocate`` fresh blocks.
    """
    new_comp = v.hits * v.bs
    t = arith.compute_slot_targets(0, new_comp, v.e, v.n, v.la, v.M)
    skipped_pred = arith.get_num_skipped_blocks(num_skipped_tokens(kind, t.num_total_computed_unclamped, v.span), v.bs)
    required = arith.get_num_required_blocks(t.num_tokens_need_slot, v.bs)
    predicted = arith.get_num_new_blocks_admission(required, skipped_pred, v.hits + v.held, v.ev)

    total = t.num_local_computed_tokens + v.e
    skipped_tokens = num_skipped_tokens(kind, total, v.span)
    skipped_blocks = arith.get_num_skipped_blocks(skipped_tokens, v.bs)
    after_hits = arith.maximum(skipped_blocks, v.hits)
    ext_left = arith.get_num_external_tokens_after_skip(total, skipped_tokens, v.e)
    fresh_ext = z3.If(ext_left > 0, arith.get_num_external_blocks_to_allocate(total, v.bs, after_hits), 0)
    fresh_new = arith.get_num_new_blocks_to_allocate(t.num_tokens_need_slot, v.bs, after_hits + fresh_ext)
    fresh = fresh_ext + fresh_new
    return Allocation(predicted, fresh, fresh + v.ev, after_hits + fresh, t.num_tokens_need_slot)


def running_allocation(kind: str, v: Vars) -> Allocation:
    """vLLM 0.33 ``allocate_slots`` for a running request (in ``num_cached_block``), one group:
    ``remove_skipped_blocks`` (step 8) only nulls entries, so the table keeps ``held`` entries;
    the predictor's fast path is ``get_num_new_blocks_running``; step 12 appends new blocks."""
    t = arith.compute_slot_targets(v.c, 0, 0, v.n, v.la, v.M)
    required = arith.get_num_required_blocks(t.num_tokens_need_slot, v.bs)
    predicted = arith.get_num_new_blocks_running(required, v.held)
    fresh = arith.get_num_new_blocks_to_allocate(t.num_tokens_need_slot, v.bs, v.held)
    return Allocation(predicted, fresh, fresh, v.held + fresh, t.num_tokens_need_slot)


def _per_kind_paths(v: Vars) -> list[tuple[str, str, Allocation, list[z3.BoolRef]]]:
    out = []
    for kind in KINDS:
        kind_premises = [v.span % v.bs == 0] if kind == "chunked_local" else []
        out.append((kind, "admission", admission_allocation(kind, v), v.admission_premises() + kind_premises))
        out.append((kind, "running", running_allocation(kind, v), v.running_premises() + kind_premises))
    return out


def _check_paths(timeout_s: float, goals_of: Any) -> Outcome:
    v = Vars.make()
    for kind, path, alloc, premises in _per_kind_paths(v):
        goals = [(f"{kind}/{path}: {name}", g) for name, g in goals_of(v, alloc, path)]
        shown = [
            ("predicted", alloc.predicted),
            ("taken", alloc.taken),
            ("table_len", alloc.table_len),
            ("need_slot", alloc.need_slot),
        ]
        outcome = prove_goals(v.all(), premises, goals, timeout_s, shown=shown)
        if outcome.status != "proven":
            model = {**outcome.model, "kind": kind, "path": path}
            return Outcome(outcome.status, outcome.goal, model, outcome.detail)
    return Outcome("proven")


# --- claims ------------------------------------------------------------------------------------


def check_slot_targets(timeout_s: float) -> Outcome:
    c, nc, e, n, la, M = z3.Ints("c new_comp e n la M")
    t = arith.compute_slot_targets(c, nc, e, n, la, M)
    premises = [c >= 0, nc >= 0, e >= 0, n >= 0, la >= 0, M >= 1, n + nc + e >= 1]
    goals = [
        ("need_slot <= max_model_len", t.num_tokens_need_slot <= M),
        ("total_computed <= max_model_len", t.total_computed_tokens <= M),
        ("total_computed <= need_slot", t.total_computed_tokens <= t.num_tokens_need_slot),
        ("need_slot >= min(main, max_model_len)", t.num_tokens_need_slot >= arith.minimum(t.num_tokens_main_model, M)),
        ("need_slot <= main + lookahead", t.num_tokens_need_slot <= t.num_tokens_main_model + la),
    ]
    return prove_goals(
        [c, nc, e, n, la, M],
        premises,
        goals,
        timeout_s,
        shown=[("total_computed", t.total_computed_tokens), ("need_slot", t.num_tokens_need_slot)],
    )


def check_table_length(timeout_s: float) -> Outcome:
    def goals(v: Vars, a: Allocation, path: str) -> list[tuple[str, z3.BoolRef]]:
        want = arith.maximum(v.held, arith.cdiv(a.need_slot, v.bs))
        return [
            ("len(table) == max(previous length, cdiv(need_slot, bs))", a.table_len == want),
            ("len(table) <= cdiv(max_model_len, bs)", a.table_len <= arith.cdiv(v.M, v.bs)),
            (
                "len(table) * bs >= total computed tokens",
                a.table_len * v.bs >= arith.minimum(v.c + v.hits * v.bs + v.e, v.M),
            ),
        ]

    return _check_paths(timeout_s, goals)


def check_predictor(timeout_s: float) -> Outcome:
    def goals(v: Vars, a: Allocation, path: str) -> list[tuple[str, z3.BoolRef]]:
        return [("predicted == fresh blocks + evictable hits touched", a.predicted == a.taken)]

    return _check_paths(timeout_s, goals)


def check_cache_bounds(timeout_s: float) -> Outcome:
    """See ``CACHE_BOUNDS``."""
    v = Vars.make()
    t = arith.compute_slot_targets(v.c, v.hits * v.bs, v.e, v.n, v.la, v.M)
    to_cache = arith.get_num_tokens_to_cache(t.total_computed_tokens, v.n, v.T)
    full = arith.get_num_full_blocks_to_cache(to_cache, v.hashes, v.bs, v.bs)
    after = z3.If(v.cached >= full, v.cached, full)  # cache_blocks returns early when nothing is new
    premises = v.common_premises() + [
        v.hashes == arith.get_num_block_hashes(v.T, v.bs),
        v.cached * v.bs <= v.T,
    ]
    goals = [
        ("tokens passed to cache_blocks <= request.num_tokens", to_cache <= v.T),
        ("tokens passed to cache_blocks <= total + new (no lookahead slot)", to_cache <= t.num_tokens_main_model),
        ("cached blocks never decrease", after >= v.cached),
        ("cached blocks * bs <= request.num_tokens", after * v.bs <= v.T),
        ("cached blocks * bs <= slots held (need_slot)", full * v.bs <= t.num_tokens_need_slot),
    ]
    return prove_goals(
        v.all(), premises, goals, timeout_s, shown=[("tokens_to_cache", to_cache), ("full_blocks", full)]
    )


def check_hit_cap(timeout_s: float) -> Outcome:
    """See ``HIT_CAP``."""
    T, bs, first_miss = z3.Ints("T bs first_miss")
    cap = arith.get_max_cache_hit_length(T)
    looked_up = arith.floordiv(cap, bs)  # the walk visits blocks 0 .. cap // bs - 1
    hit_blocks = arith.minimum(first_miss, looked_up)  # and stops at the first miss
    hit = hit_blocks * bs
    premises = [T >= 1, bs >= 1, first_miss >= 0]
    goals = [
        ("hit % block_size == 0", hit % bs == 0),
        ("0 <= hit < num_tokens", z3.And(hit >= 0, hit < T)),
        ("every looked-up block has a hash", looked_up <= arith.get_num_block_hashes(T, bs)),
        ("maximal: the next block misses or would reach num_tokens", z3.Or(hit_blocks == first_miss, hit + bs >= T)),
    ]
    return prove_goals([T, bs, first_miss], premises, goals, timeout_s, shown=[("cap", cap), ("hit", hit)])


def _allocation_trace(model: Mapping[str, Any]) -> dict[str, Any] | None:
    return allocation_trace(model)


ALLOCATION_PREMISES = (
    "block_size >= 1, max_model_len >= 1, 1 <= request.num_tokens <= max_model_len",
    "admission: the request holds no blocks; hit = len(hits) * block_size <= num_tokens - 1; "
    "hit + external <= num_tokens; something is scheduled; evictable hits <= len(hits)",
    "running: no hits, no external tokens; previous table <= cdiv(max_model_len, bs) and covers "
    "num_computed_tokens <= num_tokens",
    "chunked local: attention_chunk_size is a multiple of block_size",
)

CLAIMS = [
    Claim(
        "allocate_slots.slot_targets",
        "The slots allocate_slots asks for never exceed max_model_len, and cover the computed tokens.",
        ("all token counts >= 0", "max_model_len >= 1", "something is scheduled (step 1 rejects otherwise)"),
        check_slot_targets,
        slot_targets_trace,
    ),
    Claim(
        "allocate_slots.table_length",
        "After success a table holds exactly max(previous length, cdiv(need_slot, bs)) blocks, "
        "never more than cdiv(max_model_len, bs), for full, sliding-window and chunked-local groups.",
        ALLOCATION_PREMISES,
        check_table_length,
        _allocation_trace,
    ),
    Claim(
        "allocate_slots.predictor_matches_allocator",
        "The capacity check's prediction equals the blocks the allocator takes off the free queue "
        "(fresh blocks plus evictable hits it touches), so get_new_blocks never runs short.",
        ALLOCATION_PREMISES,
        check_predictor,
        _allocation_trace,
    ),
    Claim(
        "allocate_slots.cache_bounds",
        "The tokens handed to cache_blocks never exceed request.num_tokens nor total + new (so no "
        "draft or lookahead slot is cached); the cached block count never decreases and stays <= num_tokens.",
        (
            "all token counts >= 0",
            "1 <= num_tokens <= max_model_len",
            "len(block_hashes) == num_tokens // block_size (single group, no lookahead hashes)",
            "before the call: num_cached_block * block_size <= num_tokens",
        ),
        check_cache_bounds,
        _allocation_trace,
    ),
    Claim(
        "get_computed_blocks.hit_cap",
        "The full-attention hit (walk cap // bs blocks, stop at the first miss) is block aligned, "
        "strictly below num_tokens, uses only hashed blocks, and is maximal under the cap.",
        ("num_tokens >= 1", "block_size >= 1", "first_miss = index of the first uncached block >= 0"),
        check_hit_cap,
        hit_cap_trace,
    ),
]
