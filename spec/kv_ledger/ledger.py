"""The ledger: the identity each block slot holds, and the spans a token reads (docs/semantics.md §11).

``KVLedger`` maps a real block to the identities its slots hold; a slot that is absent is
*unwritten* (never written since the block was handed out fresh or released without a key, §11.2).
It changes only through ``write_slot`` (a model or connector write) and ``clear_block`` (a fresh
allocation, a keyless release).  It is the one mutable structure of ``spec/``: a value copy per
step would walk the pool, and the ledger is updated only at the positions a step touches.

Attention spans (§11.3), per group kind: full ``[0, p]``, sliding window ``W`` ``[p - W + 1, p]``,
chunked local ``C`` ``[p - p mod C, p]`` (vLLM 0.33 ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec``
masks; the same as ``impl.paged.attention.first_visible_position``).  Cross attention reads every
encoder position and is handled by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvspec.spec.config import AttentionSpec
from kvspec.spec.kv_ledger.identity import KVIdentity
from kvspec.spec.types import NULL_BLOCK_ID, BlockId


@dataclass
class KVLedger:
    """Per real block: slot offset -> the identity written there (absent: unwritten)."""

    held: dict[BlockId, dict[int, KVIdentity]] = field(default_factory=dict)


def get_held(ledger: KVLedger, block: BlockId, offset: int) -> KVIdentity | None:
    """What slot ``offset`` of ``block`` holds, or None when it is unwritten."""
    slots = ledger.held.get(block)
    return None if slots is None else slots.get(offset)


def write_slot(ledger: KVLedger, block: BlockId, offset: int, identity: KVIdentity) -> None:
    """A model or connector write (§11.2).  The null block is inert and is never recorded."""
    assert block != NULL_BLOCK_ID, "the null block holds nothing: check the write first"
    assert offset >= 0, f"slot offset must be >= 0, got {offset}"
    ledger.held.setdefault(block, {})[offset] = identity


def clear_block(ledger: KVLedger, block: BlockId) -> None:
    """Every slot of ``block`` becomes unwritten: handed out fresh, or released without a key (§11.2)."""
    ledger.held.pop(block, None)


def get_written_blocks(ledger: KVLedger) -> list[BlockId]:
    """The blocks holding anything (for a prefix-cache reset, which unhashes them all)."""
    return list(ledger.held)


def get_first_visible(spec: AttentionSpec, position: int) -> int:
    """The lowest position a query at ``position`` attends to in a decoder group (§11.3)."""
    assert spec.kind != "cross", "cross attention reads the encoder positions, not a span"
    if spec.kind == "sliding_window":
        assert spec.sliding_window is not None
        return max(0, position - spec.sliding_window + 1)
    if spec.kind == "chunked_local":
        assert spec.attention_chunk_size is not None
        return position - position % spec.attention_chunk_size
    return 0


def get_run_span(spec: AttentionSpec, start: int, end: int) -> range:
    """The positions tokens ``[start, end)`` read together: the union of their spans.  Each
    reader's span ends at itself and starts no later than the next one's, so the union is one range."""
    assert 0 <= start < end, f"a run computes at least one token, got [{start}, {end})"
    return range(get_first_visible(spec, start), end)


def get_first_reader(spec: AttentionSpec, start: int, end: int, position: int) -> int:
    """The first token of ``[start, end)`` whose span holds ``position`` (for witnesses)."""
    for p in range(max(start, position), end):
        if get_first_visible(spec, p) <= position:
            return p
    raise AssertionError(f"no token of [{start}, {end}) reads position {position}")


def iter_slots(position_range: range, block_size: int) -> Iterator[tuple[int, int, int]]:
    """``(position, table index, slot offset)`` for each position of a range."""
    assert block_size > 0, f"block size must be > 0, got {block_size}"
    for p in position_range:
        yield p, p // block_size, p % block_size


def get_promised_end(
    num_computed: int, num_new_computed: int, num_external: int, num_new_tokens: int, delay_cache_blocks: bool
) -> int:
    """§11.5: the positions an ``allocate_slots`` call's step will have written when its forward
    pass ends: the hits (already written), a synchronous load and the tokens it computes.  Slots
    of blocks it publishes below this end are due after the request's model run; the others (an
    asynchronous load still in flight, lookahead slots) must be written when the key appears."""
    assert min(num_computed, num_new_computed, num_external, num_new_tokens) >= 0, "counts are never negative"
    if delay_cache_blocks:
        return num_computed + num_new_computed
    return num_computed + num_new_computed + num_external + num_new_tokens
