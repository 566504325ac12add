"""What kvspec's allocator refuses: the inputs vLLM 0.33 accepts and answers with block tables that
make a token attend through the shared null block (its known bugs K1-K3, docs/upstream/).

The allocator follows vLLM 0.33's ``KVCacheManager`` block for block everywhere else.  On these
inputs it raises ``Refused`` (a ``ValueError``) before anything changes, as a validated config or a
checked call would, instead of handing out a table that reads KV no one wrote:

- K3 (docs/upstream/chunked-local-chunk-not-block-multiple.md): a chunked-local group whose chunk is
  not a multiple of its block size, refused at construction (``check_chunk_multiples``).  vLLM
  0.23.0-0.34.0 accept it; the ``ChunkedLocalAttentionManager`` lookup then counts every block before
  the block holding the chunk start as hit, and the next query's chunk starts inside it.  The report
  proposes this start-up check; vLLM's chunked attention metadata builder asserts the same at the
  first forward pass.
- K1 (docs/upstream/full-remote-load-window.md): an admission that counts every token of the request
  as computed (a KV load of the whole prompt) where that count releases a window block the token
  ``num_tokens - 1`` still reads (``check_admission``).  vLLM 0.33
  ``Scheduler._update_waiting_for_remote_kv`` then rewinds to ``num_tokens - 1`` to sample, and that
  query reads the released block.  The caller must leave the last token to compute, as vLLM's NIXL
  and Mooncake connectors do for DeepSeek-V4.1 since 0.32 (``_prefill_backoff``; fix 1 of the report).
- K2 (docs/upstream/invalid-block-recovery-window.md): a request moved back (``num_computed_tokens``
  cut at the first invalid block of a KV load, vLLM 0.33 ``Scheduler._handle_invalid_blocks``) to a
  token whose window lies in blocks the table already released (``check_resume``).  Those positions
  were never loaded and cannot be recomputed in place: the caller must recompute the request from
  scratch (free it and admit it again), the fix the report proposes for the scheduler.

K9 (window blocks freed on the computed total, vLLM up to 0.25.1) needs no refusal: the allocator
measures the window on the processed tokens, leaving ``num_in_flight_tokens`` out, as vLLM 0.26 and
later do.  K4-K8 are bugs of releases before 0.33 (block keys, hybrid lookups, admission order) that
0.33's semantics, which the allocator follows, do not have.

The checks ask the managers' own ``skipped_tokens``: the query at position ``p`` of a window group
reads from token ``skipped_tokens(p)`` on, and a table's nulls only ever form a prefix, so a query
reads a null exactly when the entry of the block holding its first read token is one.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.impl.allocator.block_pool import NULL
from kvspec.impl.allocator.request import GroupSpec
from kvspec.impl.allocator.single_type_managers import SingleTypeManager


class Refused(ValueError):
    """A config or call vLLM 0.33 accepts and answers with a table that reads the null block; the
    message starts with the known bug's id (``K1:`` ...)."""


def check_chunk_multiples(groups: Sequence[GroupSpec]) -> None:
    """K3: every chunked-local chunk is a multiple of its group's block size."""
    for gid, g in enumerate(groups):
        if g.kind == "chunked_local" and g.chunk_size % g.block_size:
            raise Refused(
                f"K3: group {gid}: attention_chunk_size {g.chunk_size} is not a multiple of block_size "
                f"{g.block_size}; vLLM 0.33 accepts it and its lookup counts the nulls before a chunk start "
                "as a hit (docs/upstream/chunked-local-chunk-not-block-multiple.md)"
            )


def check_admission(managers: Sequence[SingleTypeManager], num_computed: int, num_tokens: int) -> None:
    """K1: an admission counting ``num_computed`` tokens (hits and external ones) releases no block
    the next query reads; once every token counts as computed, that query is the recompute of
    token ``num_tokens - 1``."""
    if num_computed < num_tokens:
        return  # the next query is at num_computed, whose window the admission keeps
    last = num_tokens - 1
    for m in managers:
        first = m.skipped_tokens(last) // m.block_size
        if m.skipped_tokens(num_computed) // m.block_size > first:
            raise Refused(
                f"K1: group {m.gid}: admitting all {num_tokens} tokens as computed releases block {first}, "
                f"which the recompute of token {last} reads; leave the last token to compute "
                "(docs/upstream/full-remote-load-window.md)"
            )


def check_resume(managers: Sequence[SingleTypeManager], rid: str, position: int) -> None:
    """K2: the query at ``position`` (a request moved back below the count its window was measured
    on) reads no block its table released."""
    for m in managers:
        table = m.tables.get(rid)
        first = m.skipped_tokens(position) // m.block_size
        if table and first < len(table) and table[first] == NULL:
            raise Refused(
                f"K2: group {m.gid}: request {rid!r} resumes at token {position}, whose window starts in block "
                f"{first}, already released; recompute it from scratch "
                "(docs/upstream/invalid-block-recovery-window.md)"
            )
