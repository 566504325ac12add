"""The allocation arithmetic of vLLM 0.33's KV-cache manager, written once for ints and Z3 terms.

Every formula the spec runs lives here, and the spec calls nothing else for its arithmetic.  Each
function works on Python ints (what the spec and the harness pass) and on Z3 integer terms (what
``harness.proofs`` passes), so the proofs check the very code that runs.  The primitives
(``cdiv``, ``floordiv``, ``minimum``, ``maximum``) dispatch on the argument type; everything
above them is plain arithmetic that both kinds of number support.

Types say ``int`` for mypy; at run time a Z3 ``ArithRef`` may stand in for any argument.
Preconditions that only make sense on concrete numbers are checked by the callers (the spec's
operations), not here, so the same function can take symbolic inputs.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def _is_symbolic(*xs: Any) -> bool:
    return any(not isinstance(x, int) for x in xs)


def _z3() -> Any:
    import z3

    return z3


def floordiv(a: int, b: int) -> int:
    """``a // b`` for ``b > 0`` (Z3's ``/`` on integers is Euclidean, equal to floor when b > 0)."""
    if _is_symbolic(a, b):
        return a / b  # type: ignore[return-value]
    return a // b


def cdiv(a: int, b: int) -> int:
    """vLLM ``cdiv``: ceiling of ``a / b`` for ``b > 0``, as ``-(-a // b)``."""
    return -floordiv(-a, b)


def minimum(a: int, b: int) -> int:
    if _is_symbolic(a, b):
        return _z3().If(a <= b, a, b)  # type: ignore[no-any-return]
    return a if a <= b else b


def maximum(a: int, b: int) -> int:
    if _is_symbolic(a, b):
        import z3

        return z3.If(a >= b, a, b)  # type: ignore[no-any-return]
    return a if a >= b else b


def align_down(n: int, alignment: int) -> int:
    """The largest multiple of ``alignment`` that is ``<= n`` (for ``n >= 0``)."""
    return floordiv(n, alignment) * alignment


# --- prefix-cache lookup ---------------------------------------------------------------------


def get_max_cache_hit_length(num_tokens: int) -> int:
    """vLLM 0.33 ``KVCacheManager.get_computed_blocks`` default cap: ``request.num_tokens - 1``.

    At least one token is recomputed so the model produces logits to sample from; a prompt whose
    length is a multiple of the block size therefore recomputes its whole last block.
    """
    return num_tokens - 1


def get_num_block_hashes(num_tokens: int, hash_block_size: int) -> int:
    """vLLM 0.33 ``get_request_block_hasher`` (no lookahead): only full blocks are hashed."""
    return maximum(0, floordiv(num_tokens, hash_block_size))


def get_sliding_window_blocks_for_hit(sliding_window: int, block_size: int) -> int:
    """vLLM 0.33 ``SlidingWindowManager.find_longest_cache_hit``: ``cdiv(W - 1, bs)`` contiguous
    cached blocks cover the window of the first token after the hit (it attends to ``W - 1``
    earlier tokens)."""
    return cdiv(sliding_window - 1, block_size)


def get_chunked_local_hit_start(max_length: int, attention_chunk_size: int) -> int:
    """vLLM 0.33 ``ChunkedLocalAttentionManager.find_longest_cache_hit``: the start of the chunk
    that contains position ``max_length``; everything before it counts as hit (null blocks)."""
    return align_down(max_length, attention_chunk_size)


# --- tokens that fall out of the attention span ----------------------------------------------


def get_sliding_window_num_skipped_tokens(num_computed_tokens: int, sliding_window: int) -> int:
    """vLLM 0.33 ``SlidingWindowManager.get_num_skipped_tokens``: with ``n`` tokens computed the
    next query sits at position ``n`` and attends to ``[n - W + 1, n]``."""
    return maximum(0, num_computed_tokens - sliding_window + 1)


def get_chunked_local_num_skipped_tokens(num_computed_tokens: int, attention_chunk_size: int) -> int:
    """vLLM 0.33 ``ChunkedLocalAttentionManager.get_num_skipped_tokens``: every token before the
    chunk of position ``n``; at an exact multiple the next token starts a fresh chunk."""
    return align_down(num_computed_tokens, attention_chunk_size)


def get_num_skipped_blocks(num_skipped_tokens: int, block_size: int) -> int:
    """A block is skipped only when all its tokens are skipped: floor, never ceiling."""
    return floordiv(num_skipped_tokens, block_size)


def get_num_blocks_to_remove(num_skipped_tokens: int, block_size: int, table_len: int) -> int:
    """vLLM 0.33 ``SingleTypeKVCacheManager.remove_skipped_blocks``: ``min(s // bs, len(table))``."""
    return minimum(get_num_skipped_blocks(num_skipped_tokens, block_size), table_len)


# --- allocate_slots --------------------------------------------------------------------------


class SlotTargets(NamedTuple):
    """The token counts of the layout ``| comp | new_comp | ext_comp | new | lookahead |``
    (docs/semantics.md §3.1)."""

    num_local_computed_tokens: int  # comp + new_comp
    num_total_computed_unclamped: int  # comp + new_comp + ext_comp (passed to the predictor)
    total_computed_tokens: int  # min(local + ext, max_model_len)
    num_tokens_main_model: int  # total + new
    num_tokens_need_slot: int  # min(main + lookahead, max_model_len)


def compute_slot_targets(
    num_computed_tokens: int,
    num_new_computed_tokens: int,
    num_external_computed_tokens: int,
    num_new_tokens: int,
    num_lookahead_tokens: int,
    max_model_len: int,
) -> SlotTargets:
    """vLLM 0.33 ``KVCacheManager.allocate_slots``: the derived counts, with the two ``max_model_len``
    clamps (docs/semantics.md §3.1, step 2)."""
    local = num_computed_tokens + num_new_computed_tokens
    unclamped = local + num_external_computed_tokens
    total = minimum(unclamped, max_model_len)
    main = total + num_new_tokens
    need_slot = minimum(main + num_lookahead_tokens, max_model_len)
    return SlotTargets(local, unclamped, total, main, need_slot)


def get_num_tokens_to_cache(total_computed_tokens: int, num_new_tokens: int, num_tokens: int) -> int:
    """vLLM 0.33 ``allocate_slots``, last step (docs/semantics.md §3.1 step 11, §10.9): cap at
    ``request.num_tokens`` so that unverified drafts (never in ``all_token_ids``) and lookahead
    slots are never cached."""
    return minimum(total_computed_tokens + num_new_tokens, num_tokens)


def get_num_required_blocks(num_tokens: int, block_size: int) -> int:
    """Blocks that cover ``num_tokens`` slots."""
    return cdiv(num_tokens, block_size)


def get_num_new_blocks_running(num_required_blocks: int, num_held_blocks: int) -> int:
    """vLLM 0.33 predictor, running fast path: ``max(required - held, 0)`` (rejected drafts can
    leave a table longer than needed)."""
    return maximum(num_required_blocks - num_held_blocks, 0)


def get_num_new_blocks_admission(
    num_required_blocks: int, num_skipped_blocks: int, num_local_blocks: int, num_evictable_hits: int
) -> int:
    """vLLM 0.33 predictor for a request not yet admitted: fresh blocks beyond the skipped and the
    already-held (hit) prefix, plus hits with ``ref_cnt == 0`` that touching takes off the free
    queue."""
    return maximum(num_required_blocks - maximum(num_skipped_blocks, num_local_blocks), 0) + num_evictable_hits


def get_num_external_tokens_after_skip(
    num_total_computed_tokens: int, num_skipped_tokens: int, num_external_computed_tokens: int
) -> int:
    """vLLM 0.33 ``allocate_external_computed_blocks``: external tokens that fall before the window
    need no blocks."""
    return minimum(num_total_computed_tokens - num_skipped_tokens, num_external_computed_tokens)


def is_external_skip_clamped(rule: str, num_skipped_tokens: int, block_size: int) -> bool:
    """Whether external tokens are cut to the window before their blocks are allocated: whenever
    any token is skipped (vLLM 0.24 on, ``rule == "tokens"``), or only once a whole block is
    (0.23 ``allocate_new_computed_blocks``, ``rule == "blocks"``: it then allocates a real block
    for external tokens already out of the window)."""
    return num_skipped_tokens > 0 if rule == "tokens" else num_skipped_tokens // block_size > 0


def get_num_external_blocks_to_allocate(num_total_computed_tokens: int, block_size: int, num_held_blocks: int) -> int:
    """vLLM 0.33 ``allocate_external_computed_blocks``: clamped at 0 (speculative over-allocation)."""
    return maximum(0, cdiv(num_total_computed_tokens, block_size) - num_held_blocks)


def get_num_new_blocks_to_allocate(num_tokens: int, block_size: int, num_held_blocks: int) -> int:
    """vLLM 0.33 ``allocate_new_blocks``: the table only grows, to ``cdiv(num_tokens, bs)``."""
    return maximum(0, cdiv(num_tokens, block_size) - num_held_blocks)


def get_num_full_blocks_to_cache(num_tokens: int, num_block_hashes: int, hash_block_size: int, block_size: int) -> int:
    """vLLM 0.33 ``SingleTypeKVCacheManager.cache_blocks``: full blocks whose hash exists."""
    return floordiv(minimum(num_tokens, num_block_hashes * hash_block_size), block_size)


def get_sliding_window_admission_cap(
    sliding_window: int, max_in_flight_tokens: int, max_model_len: int, block_size: int
) -> int:
    """vLLM 0.33 ``max_admission_blocks_per_request`` for sliding window: the window, the tokens
    in flight, and one more block because the window need not start on a block boundary."""
    return cdiv(minimum(sliding_window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1


def get_chunked_local_admission_cap(
    attention_chunk_size: int, max_in_flight_tokens: int, max_model_len: int, block_size: int
) -> int:
    """vLLM 0.33 ``max_admission_blocks_per_request`` for chunked local attention."""
    return cdiv(minimum(attention_chunk_size + max_in_flight_tokens, max_model_len), block_size)
