"""Window coverage where vLLM 0.33.0 breaks it: for each failing path, the exact condition, proven
for all sizes as ``violation <=> condition``, then the smallest counterexample, one at realistic sizes
and how many prompt lengths hit it (docs/upstream/).

A *violation* is a computed query that reads a position of the table's null prefix (see
``harness.proofs.coverage`` for the model).  Each claim proves two goals: every violation satisfies
the stated condition, and whenever the condition holds the first position the query reads is in the
null prefix (the witness).  The conditions are written here independently of ``spec``; the null
prefixes come from the spec's own skip arithmetic, so mutating either makes the claim fail.

1. **Full remote load** (P/D): the connector supplies the whole prompt, ``h + e = T``; admission pads
   ``skip(T) // bs`` nulls; on arrival the scheduler sets ``num_computed_tokens = T - 1`` so token
   ``T - 1`` is recomputed for sampling (vLLM 0.33 ``Scheduler._update_waiting_for_remote_kv``).
2. **Invalid-block recovery** (one group, ``kv_load_failure_policy="recompute"``): a load of
   ``T0 = h + e`` tokens reports block ``i`` invalid; ``num_computed_tokens`` becomes ``i * bs``
   (``Scheduler._update_requests_with_invalid_blocks``) while the table keeps its admission nulls.
3. **Chunk not a multiple of the block size**: the chunked-local lookup counts the blocks before
   the chunk of ``max_length`` as hit (nulls) although the next query's chunk starts inside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import z3

from kvspec.harness.proofs.core import PROVEN, Claim, Outcome, prove_goals
from kvspec.harness.proofs.coverage import (
    Goals,
    Group,
    Num,
    first_read,
    group_spec,
    reads_null,
    removed_blocks,
    skipped_blocks,
)
from kvspec.spec import arith

SW, CL, FULL = "sliding_window", "chunked_local", "full"
CONTEXT = 131072
"""Prompt lengths counted for the fractions: 1 .. 128K (gpt-oss, Llama 4 Scout serve at least this)."""


def _and(*xs: Any) -> Any:
    return all(xs) if all(isinstance(x, bool) for x in xs) else z3.And(*xs)


def _fdiv(a: Num, b: Num) -> Num:
    """Floor division for b > 0 (Z3's ``/`` is Euclidean, equal to floor then)."""
    return a // b if isinstance(a, int) and isinstance(b, int) else a / b


# --- the conditions (independent of spec) --------------------------------------------------------


def full_load_condition(kind: str, T: Num, span: Num, bs: Num) -> Any:
    """The query at ``T - 1`` reads a null after a full remote load of ``T`` tokens iff ..."""
    if kind == SW:
        x = T - span + 1  # the window of the next token would start here
        return _and(x >= bs, x % bs == 0)
    if kind == CL:
        return _and(T % span == 0, T >= span, T % bs < span)
    return False


def invalid_block_condition(kind: str, T0: Num, i: Num, span: Num, bs: Num) -> Any:
    """Recomputing from invalid block ``i`` of a ``T0``-token load reads a null iff ... (chunked local
    only with ``C % bs == 0``, where it never does)."""
    if kind != SW:
        return False
    x = T0 - span + 1
    return _and(x >= bs, (i - _fdiv(x, bs)) * bs < span - 1)


def chunk_condition(h: Num, e: Num, r: Num, C: Num) -> Any:
    """After a chunked-local hit of ``h`` tokens (``r`` of its blocks real) and ``e`` external tokens,
    the query at ``h + e`` reads a null iff the hit is all nulls and ``h + e`` lies before the first
    chunk boundary at or after ``h``."""
    return _and(r == 0, h + e < _fdiv(h + C - 1, C) * C)


# --- the paths -----------------------------------------------------------------------------------


def _equivalence(first: Num, p: Num, z: Num, bs: Num, q: Any, cond: Any) -> Goals:
    return [
        ("violation => condition", z3.Implies(reads_null(first, p, z, bs, q), cond)),
        (
            "condition => violation (witness: the first position read)",
            z3.Implies(cond, reads_null(first, p, z, bs, first)),
        ),
    ]


def full_load_paths(fixed: bool = False) -> Iterator[tuple[str, list[Any], Goals, list[Any]]]:
    """Per kind: admission with ``h + e = T`` (hit of any valid shape), arrival, rewind to ``T - 1``,
    the next ``allocate_slots`` at ``T - 1``.  ``fixed``: the admission skip is computed for ``T - 1``
    tokens (the proposed fix); the goal is then that nothing null is read."""
    for kind in (FULL, SW, CL):
        g = Group.make(kind)
        T, h, e, ml, L, q = z3.Ints("T hit external max_length table_len q")
        hit_ps, lemmas = g.hit(h, ml, T, chunk_multiple=False)
        first, defs, k = g.query(T - 1, "p")
        n_adm = T - 1 if fixed else T
        z = arith.maximum(arith.maximum(skipped_blocks(g.spec, n_adm), g.hz), removed_blocks(g.spec, T - 1, L))
        premises = [T >= 1, e >= 1, h + e == T, L >= 0, *hit_ps, *defs]
        if g.chunked:
            kT = k if fixed else z3.Int("chunk_of_T")  # the chunk of the admission count
            premises += [kT * g.span <= n_adm, n_adm < (kT + 1) * g.span]
            lemmas += g.skip_lemmas(n_adm, kT, chunk_multiple=False)
            lemmas += [] if fixed else g.skip_lemmas(T - 1, k, chunk_multiple=False)
            lemmas += [
                (
                    "lemma: admission nulls end at or before the chunk start",
                    skipped_blocks(g.spec, n_adm) * g.bs <= kT * g.span,
                ),
                (
                    "lemma: removal nulls end at or before T - 1's chunk start",
                    removed_blocks(g.spec, T - 1, L) * g.bs <= k * g.span,
                ),
            ]
        if fixed:
            goals = [*lemmas, ("no null is read", z3.Not(reads_null(first, T - 1, z, g.bs, q)))]
        else:
            goals = lemmas + _equivalence(first, T - 1, z, g.bs, q, full_load_condition(kind, T, g.span, g.bs))
        yield kind, premises, goals, [T, h, e, ml, L, q, *g.vars()]


def invalid_block_paths() -> Iterator[tuple[str, list[Any], Goals, list[Any]]]:
    """Per kind, one group: admission of ``T0 = h + e <= T`` tokens, the first invalid block ``i`` is a
    loaded one (``h <= i * bs < T0``, not a null), ``num_computed_tokens = i * bs``, next allocation."""
    for kind in (FULL, SW, CL):
        g = Group.make(kind)
        T, T0, h, e, ml, L, i, q = z3.Ints("T T0 hit external max_length table_len invalid_block q")
        hit_ps, lemmas = g.hit(h, ml, T)
        c = i * g.bs
        first, defs, k = g.query(c, "p")
        z0 = g.admission_nulls(T0)
        z = arith.maximum(z0, removed_blocks(g.spec, c, L))
        premises = [T >= 1, e >= 1, h + e == T0, T0 <= T, L >= 0, i >= z0, c >= h, c < T0, *hit_ps, *defs]
        if g.chunked:
            kT = z3.Int("chunk_of_T0")
            premises += [kT * g.span <= T0, T0 < (kT + 1) * g.span]
            lemmas += g.skip_lemmas(T0, kT) + g.skip_lemmas(c, k)
        goals = lemmas + _equivalence(first, c, z, g.bs, q, invalid_block_condition(kind, T0, i, g.span, g.bs))
        yield kind, premises, goals, [T, T0, h, e, ml, L, i, q, *g.vars()]


def chunk_paths() -> Iterator[tuple[str, list[Any], Goals, list[Any]]]:
    """Chunked local with any ``C`` and ``bs``: admission with a hit of the spec's shape and ``e``
    external tokens, ``h + e <= T - 1``; the first query sits at ``h + e``."""
    g = Group.make(CL)
    T, h, e, ml, q, kh = z3.Ints("T hit external max_length q ceil_hit_over_C")
    hit_ps, lemmas = g.hit(h, ml, T, chunk_multiple=False)
    km = g.max_length_chunk()
    p = h + e
    first, defs, k = g.query(p, "p")
    C = g.span
    premises = [T >= 1, e >= 0, p <= T - 1, (kh - 1) * C < h, h <= kh * C, *hit_ps, *defs]
    start = arith.get_chunked_local_hit_start(ml, C)
    lemmas += g.skip_lemmas(p, k, chunk_multiple=False) + [
        ("lemma: the hit's nulls end at or before max_length's chunk start", g.hz * g.bs <= start),
        ("lemma: ... and within one block of it", start < (g.hz + 1) * g.bs),
        ("lemma: skip(p) ends at or before p's chunk start", skipped_blocks(g.spec, p) * g.bs <= k * C),
        ("lemma: ceil(h / C)", _fdiv(h + C - 1, C) == kh),
        ("lemma: a hit with a real block ends past max_length's chunk start", z3.Implies(g.r >= 1, h > km * C)),
        ("lemma: then p's chunk starts no earlier", z3.Implies(h > km * C, k >= km)),
        ("lemma: p < ceil(h / C) * C iff p's chunk starts before h", (p < kh * C) == (k < kh)),
        ("lemma: a chunk start below ceil(h / C) * C is below h", z3.Implies(k < kh, k * C < h)),
    ]
    z = g.admission_nulls(p)
    goals = lemmas + _equivalence(first, p, z, g.bs, q, chunk_condition(h, e, g.r, C))
    yield CL, premises, goals, [T, h, e, ml, q, *g.vars()]


def _prove(paths: Iterator[tuple[str, list[Any], Goals, list[Any]]], timeout_s: float) -> Outcome:
    for kind, premises, goals, variables in paths:
        outcome = prove_goals(variables, premises, [(f"{kind}: {n}", t) for n, t in goals], timeout_s, chain=True)
        if outcome.status != PROVEN:
            return outcome
    return Outcome(PROVEN)


# --- concrete: counterexamples and fractions (the same composition on ints) ----------------------


def full_load_violation(kind: str, T: int, span: int, bs: int) -> bool:
    """Full remote load of ``T`` tokens with no local hit; the query at ``T - 1`` reads a null."""
    g = group_spec(kind, bs, span)
    z = max(skipped_blocks(g, T), removed_blocks(g, T - 1, arith.cdiv(T, bs)))
    return bool(first_read(kind, T - 1, span) < z * bs)


def invalid_block_violation(kind: str, T0: int, i: int, span: int, bs: int) -> bool:
    """A ``T0``-token load (no local hit) whose first invalid block is ``i``."""
    g = group_spec(kind, bs, span)
    z = max(skipped_blocks(g, T0), removed_blocks(g, i * bs, arith.cdiv(T0, bs)))
    return bool(first_read(kind, i * bs, span) < z * bs)


def loaded_blocks(kind: str, T0: int, span: int, bs: int) -> range:
    """Indices of the real (loaded) blocks of a ``T0``-token load with no local hit."""
    return range(skipped_blocks(group_spec(kind, bs, span), T0), arith.cdiv(T0, bs))


def chunk_violation(T: int, C: int, bs: int) -> bool:
    """A fresh request of ``T`` tokens, nothing cached: the hit is the null prefix alone."""
    hz = arith.floordiv(arith.get_chunked_local_hit_start(arith.get_max_cache_hit_length(T), C), bs)
    z = max(skipped_blocks(group_spec(CL, bs, C), hz * bs), hz)
    return bool(first_read(CL, hz * bs, C) < z * bs)


def smallest(pred: Callable[[int, int, int], bool], limit: int = 48) -> tuple[int, int, int] | None:
    """The least ``(T, span, bs)`` (in that order) with ``span, bs >= 2`` satisfying ``pred``."""
    for T in range(1, limit + 1):
        for span in range(2, 17):
            for bs in range(2, 17):
                if pred(T, span, bs):
                    return T, span, bs
    return None


def lengths(pred: Callable[[int], bool], n: int = CONTEXT) -> tuple[int, list[int]]:
    """How many of ``T = 1 .. n`` satisfy ``pred``, and the first three."""
    hits = [T for T in range(1, n + 1) if pred(T)]
    return len(hits), hits[:3]


def _share(count: int, n: int = CONTEXT) -> str:
    return f"{count} of T <= {n} ({100 * count / n:.3g}%)"


def check_full_remote_load(timeout_s: float) -> Outcome:
    outcome = _prove(full_load_paths(), timeout_s)
    if outcome.status != PROVEN:
        return outcome
    fixed = _prove(full_load_paths(fixed=True), timeout_s)
    if fixed.status != PROVEN:
        return Outcome(fixed.status, f"fix: {fixed.goal}", fixed.model, fixed.detail)
    lines = [
        "violation <=> sliding window: T - W + 1 >= B and (T - W + 1) % B == 0; chunked local: "
        "T % C == 0 and T >= C and T % B < C; full: never",
        "with the admission skip computed for T - 1 tokens (proposed fix): never",
    ]
    model: dict[str, Any] = {}
    for kind, name in ((SW, "W"), (CL, "C")):
        s = smallest(partial(full_load_violation, kind))
        model[f"smallest_{kind}"] = s
        lines.append(f"smallest ({name}, B >= 2): {kind} T={s[0]} {name}={s[1]} B={s[2]}" if s else f"{kind}: none")
    for kind, span, bs, who in (
        (SW, 4096, 16, "Mistral-7B-v0.1, Gemma 2"),
        (SW, 1024, 16, "Gemma 3"),
        (SW, 128, 16, "gpt-oss"),
        (CL, 8192, 16, "Llama 4"),
    ):
        count, first = lengths(lambda T: full_load_violation(kind, T, span, bs))  # noqa: B023 (called at once)
        name = "W" if kind == SW else "C"
        model[f"{kind}_{name}{span}_B{bs}"] = {"count": count, "first": first, "n": CONTEXT}
        lines.append(f"{name}={span} B={bs} ({who}): T = {', '.join(map(str, first))}, ...: {_share(count)}")
    return Outcome(PROVEN, model=model, detail="\n".join(lines))


def check_invalid_block(timeout_s: float) -> Outcome:
    outcome = _prove(invalid_block_paths(), timeout_s)
    if outcome.status != PROVEN:
        return outcome
    lines = [
        "violation <=> sliding window: z >= 1 and (i - z) * B < W - 1, z = (T0 - W + 1) // B the load's "
        "null blocks, i the first invalid block; chunked local (C % B == 0), full: never"
    ]
    s = smallest(lambda T0, a, b: any(invalid_block_violation(SW, T0, i, a, b) for i in loaded_blocks(SW, T0, a, b)))
    model: dict[str, Any] = {"smallest_sliding_window": s}
    if s:
        bad = [i for i in loaded_blocks(SW, *s) if invalid_block_violation(SW, *s, i)]
        lines.append(f"smallest (W, B >= 2): T0={s[0]} W={s[1]} B={s[2]}, first invalid block {bad[0]}")
    for W, bs in ((4096, 16), (128, 16)):
        period = range(W + bs - 1, W + 2 * bs - 1)  # from the first T0 with a null block on, periodic in T0
        shares = {
            (
                sum(invalid_block_violation(SW, T0, i, W, bs) for i in loaded_blocks(SW, T0, W, bs)),
                len(loaded_blocks(SW, T0, W, bs)),
            )
            for T0 in period
        }
        model[f"sliding_window_W{W}_B{bs}"] = sorted(shares)
        bad = sorted({v for v, _ in shares})
        sizes = sorted({t for _, t in shares})
        lines.append(
            f"W={W} B={bs}: any T0 >= {W + bs - 1}; a failure in any of the first {'-'.join(map(str, bad))} "
            f"of its {'-'.join(map(str, sizes))} loaded blocks triggers it"
        )
    return Outcome(PROVEN, model=model, detail="\n".join(lines))


def check_chunk_not_multiple(timeout_s: float) -> Outcome:
    outcome = _prove(chunk_paths(), timeout_s)
    if outcome.status != PROVEN:
        return outcome
    lines = [
        "violation <=> the hit has no real block (r == 0) and h + e < ceil(h / C) * C (h = hit, e = external); "
        "with C % B == 0 never (window_coverage.holds)"
    ]
    s = smallest(chunk_violation)
    model: dict[str, Any] = {"smallest": s}
    if s:
        lines.append(f"smallest (C, B >= 2), fresh request: T={s[0]} C={s[1]} B={s[2]}")
    for C, bs in ((40, 16), (8192, 48)):
        count, first = lengths(lambda T: chunk_violation(T, C, bs))  # noqa: B023 (called at once)
        model[f"C{C}_B{bs}"] = {"count": count, "first": first, "n": CONTEXT}
        lines.append(
            f"C={C} B={bs}, fresh request (nothing cached): T = {', '.join(map(str, first))}, ...: {_share(count)}"
        )
    return Outcome(PROVEN, model=model, detail="\n".join(lines))


CLAIMS = [
    Claim(
        "window_coverage.full_remote_load",
        "After a KV load of the whole prompt the scheduler recomputes token T - 1, whose window the "
        "admission already nulled exactly when the stated condition holds (derived and proven both ways); "
        "an admission skip for T - 1 tokens removes it.",
        (
            "block_size, window, chunk >= 1",
            "local hit + external == num_tokens (T), external >= 1; the hit has the spec's shape",
            "on arrival num_computed_tokens = T - 1 (vLLM 0.33 _update_waiting_for_remote_kv)",
        ),
        check_full_remote_load,
        bound="unbounded integers; examples and fractions: exhaustive on ints (T <= 131072)",
    ),
    Claim(
        "window_coverage.invalid_block_recovery",
        "Recomputing from the first invalid block of a KV load reads a null block exactly when the stated "
        "condition holds (derived and proven both ways).",
        (
            "one KV-cache group (vLLM 0.33 raises for several)",
            "kv_load_failure_policy = recompute",
            "the invalid block is a loaded one (not a null, not a local hit)",
            "chunked local: attention_chunk_size % block_size == 0",
        ),
        check_invalid_block,
        bound="unbounded integers; examples: exhaustive on ints over one period of T0",
    ),
    Claim(
        "window_coverage.chunk_not_block_multiple",
        "With attention_chunk_size % block_size != 0 the first query after a chunked-local hit reads the "
        "hit's null blocks exactly when the stated condition holds (derived and proven both ways).",
        ("block_size, chunk >= 1 (any combination)", "hit + external <= num_tokens - 1; the hit has the spec's shape"),
        check_chunk_not_multiple,
        bound="unbounded integers; examples and fractions: exhaustive on ints (T <= 131072)",
    ),
]
