"""The KV-content oracle's own facts about a request, beside its ``harness.book`` record.

``KVCheckTarget`` keeps a ``RequestBook`` whose native objects are ``OracleRequest``: the book's
record (tokens, drafts, computed count, LoRA, multimodal items; changed only by
``RequestBook.apply``) plus what only the model runner needs (the LoRA embedding slot, drafts
scheduled in the current step, the last allocation, pending hit ranges and connector loads, the
last prefix-cache lookup, the cached dense run).

LoRA adapters and multimodal items change the numbers as they do in a real model: a request's LoRA
shifts its token embeddings into another range of the vocabulary, and multimodal placeholder
positions take embeddings derived from the item's identifier.  ``cache_salt`` changes no number.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.book import BookRequest
from harness.kv_dense import DenseRun

BASE_VOCAB = 64  # token ids are taken modulo this
LORA_SLOTS = 4  # distinct LoRA adapters that get distinct embeddings (more wrap around)
MM_BASE = BASE_VOCAB * (1 + LORA_SLOTS)  # multimodal placeholder embeddings start here
VOCAB = MM_BASE + BASE_VOCAB
FILLER = -1  # token of padded draft slots the scheduler computes but never shows (pad_spec_decode)


@dataclass
class Alloc:
    """The last successful ``allocate_slots`` of a request, in token positions."""

    start: int  # num_computed_tokens when it ran
    hit: int  # num_new_computed_tokens
    ext: int  # num_external_computed_tokens
    delay: bool  # delay_cache_blocks: the external KV arrives later


@dataclass(eq=False)
class OracleRequest:
    """The oracle's own facts about a request, beside its book record ``rec`` (tokens, drafts,
    computed count: changed only by ``RequestBook.apply``)."""

    rec: BookRequest
    lora_slot: int
    sched_drafts: tuple[int, ...] = ()  # drafts cleared when scheduled, until the step ends
    alloc: Alloc | None = None
    pending_hit: list[tuple[int, int]] = field(default_factory=list)  # hit ranges to verify before the next run
    pending_ext: tuple[int, int] | None = None  # async connector load not yet arrived
    lookup: list[list[int]] | None = None  # block ids of the last get_computed_blocks
    dense: DenseRun | None = None

    @property
    def rid(self) -> str:
        return self.rec.request_id

    def sequence(self, n: int) -> list[int]:
        """Raw token ids of positions ``[0, n)``: verified tokens, then drafts, then filler."""
        seq = self.rec.all_token_ids + list(self.rec.spec_token_ids or self.sched_drafts)
        return (seq + [FILLER] * max(0, n - len(seq)))[:n]

    def virtual(self, raw: Sequence[int]) -> tuple[int, ...]:
        """Model token ids: LoRA shifts the embedding range, multimodal positions use the item's."""
        base = BASE_VOCAB * self.lora_slot
        out = [base + t % BASE_VOCAB for t in raw]
        for m in self.rec.mm_features:
            h = zlib.crc32(m.identifier.encode())
            for p in range(m.offset, min(m.offset + m.length, len(out))):
                out[p] = MM_BASE + (h + p - m.offset) % BASE_VOCAB
        return tuple(out)
