"""Claims about what sliding-window and chunked-local groups free and what their hits claim.

The attention semantics are written independently of ``spec.arith``: a query at position ``p``
attends to ``[p - W + 1, p]`` (sliding window ``W``) or to ``[k*C, p]`` with ``k*C <= p < (k+1)*C``
(chunked local, chunk ``C``).  With ``n`` tokens computed every future query sits at ``p >= n``.
Block ``i`` of size ``bs`` holds positions ``[i*bs, (i+1)*bs)``; ``remove_skipped_blocks`` nulls
blocks ``0 .. k-1`` with ``k = get_num_blocks_to_remove(skipped(n), bs, len(table))``.

* Safety: no position of a removed block is attended by any future query.
* No leak: every block of the table that no future query can attend is removed.

Both over unbounded block sizes, windows/chunks, computed counts and table lengths.
"""

from __future__ import annotations

import z3

from kvspec.harness.proofs.core import Claim, Outcome, prove_goals
from kvspec.spec import arith


def check_sliding_window_remove(timeout_s: float) -> Outcome:
    bs, W, n, L, i, q = z3.Ints("bs W n table_len i q")
    k = arith.get_num_blocks_to_remove(arith.get_sliding_window_num_skipped_tokens(n, W), bs, L)
    premises = [bs >= 1, W >= 1, n >= 0, L >= 0]
    in_block = z3.And(i * bs <= q, q < (i + 1) * bs)
    # q is attended by some p >= n  <=>  q >= 0 and q >= n - W + 1 (take p = max(n, q))
    attended = z3.And(q >= 0, q >= n - W + 1)
    # block i is attended by no future query <=> its last position is before n - W + 1
    unused = (i + 1) * bs - 1 < n - W + 1
    goals = [
        ("safety: removed blocks hold no attended position", z3.Not(z3.And(i >= 0, i < k, in_block, attended))),
        ("no leak: every unattended block of the table is removed", z3.Implies(z3.And(i >= 0, i < L, unused), i < k)),
        ("removes no more than the table", z3.And(k >= 0, k <= L)),
    ]
    return prove_goals([bs, W, n, L, i, q], premises, goals, timeout_s, shown=[("blocks_removed", k)])


def check_sliding_window_hit_rule(timeout_s: float) -> Outcome:
    """``need = cdiv(W - 1, bs)`` contiguous blocks ending at a hit end ``e`` hold every position
    ``e - d`` (``1 <= d <= W - 1``) the next query attends to, and ``need - 1`` blocks do not."""
    bs, W, d = z3.Ints("bs W d")
    need = arith.get_sliding_window_blocks_for_hit(W, bs)
    premises = [bs >= 1, W >= 1]
    goals = [
        ("need >= 0", need >= 0),
        (
            "covers: every attended earlier position lies in the need blocks",
            z3.Implies(z3.And(d >= 1, d <= W - 1), d <= need * bs),
        ),
        ("least: need - 1 blocks miss an attended position", z3.Implies(need >= 1, W - 1 > (need - 1) * bs)),
    ]
    return prove_goals([bs, W, d], premises, goals, timeout_s, shown=[("need", need)])


def check_chunked_local_remove(timeout_s: float) -> Outcome:
    """The attended set is characterised first (a lemma, proven here too): a query at ``p >= n``
    lies in a chunk starting at or after the start ``kn*C`` of ``n``'s chunk, and the query at ``n``
    attends to ``kn*C`` itself, so the positions future queries attend are exactly ``q >= kn*C``."""
    bs, C, n, L, i, p, kn, kp = z3.Ints("bs C n table_len i p chunk_of_n chunk_of_p")
    k = arith.get_num_blocks_to_remove(arith.get_chunked_local_num_skipped_tokens(n, C), bs, L)
    premises = [bs >= 1, C >= 1, n >= 0, L >= 0, kn * C <= n, n < (kn + 1) * C]
    first_attended = kn * C
    goals = [
        (
            "lemma: the skipped tokens are the start of n's chunk",
            arith.get_chunked_local_num_skipped_tokens(n, C) == first_attended,
        ),
        (
            "lemma: a later query's chunk starts no earlier than n's chunk",
            z3.Implies(z3.And(p >= n, kp * C <= p, p < (kp + 1) * C), kp * C >= first_attended),
        ),
        ("safety: removed blocks end before the first attended position", k * bs <= first_attended),
        (
            "no leak: every block wholly before the chunk of position n is removed",
            z3.Implies(z3.And(i >= 0, i < L, (i + 1) * bs <= first_attended), i < k),
        ),
        (
            "exact chunk multiple: at n = m*C every earlier block is removed",
            z3.Implies(z3.And(n % C == 0, i >= 0, i < L, (i + 1) * bs <= n), i < k),
        ),
        ("removes no more than the table", z3.And(k >= 0, k <= L)),
    ]
    return prove_goals(
        [bs, C, n, L, i, p, kn, kp], premises, goals, timeout_s, shown=[("blocks_removed", k)], chain=True
    )


def _chunked_hit_goals(with_multiple_premise: bool, timeout_s: float) -> Outcome:
    bs, C, ml, h, kh, kc = z3.Ints("bs C max_length hit chunk_of_hit C_over_bs")
    start = arith.get_chunked_local_hit_start(ml, C)
    start_block = arith.floordiv(start, bs)
    max_blocks = arith.floordiv(ml, bs)
    premises = [
        bs >= 1,
        C >= 1,
        ml >= 0,
        # the scan returns start_block nulls plus a run of cached blocks, within max_length
        # (nulls up to start_block, then blocks start_block .. max_blocks - 1 while cached)
        h % bs == 0,
        h >= start_block * bs,
        z3.Or(h == start_block * bs, h <= max_blocks * bs),
        # the first query after the hit sits at h, in chunk [kh*C, (kh+1)*C)
        kh * C <= h,
        h < (kh + 1) * C,
    ]
    if with_multiple_premise:
        premises.append(C == kc * bs)
    goals = [
        ("null blocks counted as hit lie wholly before the chunk of the next query", start_block * bs <= kh * C),
        ("the null prefix is within max_length", start_block * bs <= ml),
        ("the hit is within max_length", h <= ml),
    ]
    return prove_goals(
        [bs, C, ml, h, kh, kc], premises, goals, timeout_s, shown=[("start", start), ("start_block", start_block)]
    )


def check_chunked_local_hit_start(timeout_s: float) -> Outcome:
    """See ``CLAIMS``; ``check_chunked_local_hit_start_any_chunk`` drops the multiple premise."""
    return _chunked_hit_goals(True, timeout_s)


def check_chunked_local_hit_start_any_chunk(timeout_s: float) -> Outcome:
    """Without ``C % bs == 0`` the hit is unsound: Z3 finds (for example) bs = 3, C = 2: nulls up
    to the block containing the chunk start are claimed while the next query's chunk begins inside
    them.  vLLM 0.33 does not check this combination (a single chunked group has alignment = bs)."""
    return _chunked_hit_goals(False, timeout_s)


CLAIMS = [
    Claim(
        "sliding_window.remove_skipped",
        "remove_skipped_blocks(n) frees only blocks no future query attends to (safety) and every "
        "block of the table that none attends to (no leak).",
        ("block_size >= 1", "sliding_window >= 1", "num_computed_tokens >= 0", "table length >= 0"),
        check_sliding_window_remove,
    ),
    Claim(
        "sliding_window.hit_rule",
        "cdiv(W - 1, bs) contiguous cached blocks are the fewest that cover the window of the first "
        "query after a block-aligned hit.",
        ("block_size >= 1", "sliding_window >= 1"),
        check_sliding_window_hit_rule,
    ),
    Claim(
        "chunked_local.remove_skipped",
        "remove_skipped_blocks(n) frees only blocks no future query attends to, every block wholly "
        "before the chunk of position n, including at exact chunk multiples.",
        ("block_size >= 1", "attention_chunk_size >= 1", "num_computed_tokens >= 0", "table length >= 0"),
        check_chunked_local_remove,
    ),
    Claim(
        "chunked_local.hit_start",
        "The null blocks a chunked-local hit counts as computed lie wholly before the chunk of the "
        "first query after the hit.",
        (
            "block_size >= 1",
            "attention_chunk_size is a multiple of block_size",
            "the hit is a block-aligned length between the null prefix and max_length",
        ),
        check_chunked_local_hit_start,
    ),
]
