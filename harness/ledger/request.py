"""What the op -> KV-event mapping knows of a request, beside its ``harness.core.book`` record.

The op -> KV-event mapping (``harness.ledger.schedule``) keeps a ``RequestBook`` whose native objects
are ``ScheduledRequest``: the book's record (tokens, drafts, computed count, LoRA, multimodal items;
changed only by ``RequestBook.apply``) plus what the mapping needs (drafts scheduled in the current
step, the last allocation, pending hit ranges and connector loads, the last prefix-cache lookup).
The oracle's ``harness.oracle.request.OracleRequest`` adds the LoRA embedding slot and the cached
dense run; the ledger's ``harness.ledger.checker.LedgerRequest`` adds the request's identities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvspec.harness.core.book import BookRequest

FILLER = -1  # token of padded draft slots the scheduler computes but never shows (pad_spec_decode)


@dataclass
class Alloc:
    """The last successful ``allocate_slots`` of a request, in token positions."""

    start: int  # num_computed_tokens when it ran
    hit: int  # num_new_computed_tokens
    ext: int  # num_external_computed_tokens
    delay: bool  # delay_cache_blocks: the external KV arrives later
    new: int = 0  # num_new_tokens
    enc: int = 0  # num_encoder_tokens


@dataclass(eq=False)
class ScheduledRequest:
    """What the op -> KV-event mapping (``harness.ledger.schedule``) knows about a request, beside its
    book record ``rec`` (tokens, drafts, computed count: changed only by ``RequestBook.apply``)."""

    rec: BookRequest
    sched_drafts: tuple[int, ...] = ()  # drafts cleared when scheduled, until the step ends
    alloc: Alloc | None = None
    admission: Alloc | None = None  # the allocation that brought prefix hits or connector tokens
    pending_hit: list[tuple[int, int]] = field(default_factory=list)  # hit ranges to verify before the next run
    pending_ext: tuple[int, int] | None = None  # async connector load not yet arrived
    lookup: list[list[int]] | None = None  # block ids of the last get_computed_blocks
    recompute: tuple[str, int] | None = None  # why positions below a high-water mark run again

    @property
    def rid(self) -> str:
        return self.rec.request_id

    def known_tokens(self) -> list[int]:
        """Verified tokens, then the drafts computed in this step (or proposed for the next)."""
        return self.rec.all_token_ids + list(self.rec.spec_token_ids or self.sched_drafts)

    def sequence(self, n: int) -> list[int]:
        """Raw token ids of positions ``[0, n)``: verified tokens, then drafts, then filler."""
        seq = self.known_tokens()
        return (seq + [FILLER] * max(0, n - len(seq)))[:n]
