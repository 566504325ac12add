"""The KV-content oracle's own facts about a request (``harness.ledger.request`` holds the shared ones).

LoRA adapters and multimodal items change the numbers as they do in a real model: a request's LoRA
shifts its token embeddings into another range of the vocabulary, and multimodal placeholder
positions take embeddings derived from the item's identifier.  ``cache_salt`` changes no number.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvspec.harness.ledger.request import ScheduledRequest

if TYPE_CHECKING:  # torch only where the oracle runs
    from kvspec.harness.oracle.dense import DenseRun

BASE_VOCAB = 64  # token ids are taken modulo this
LORA_SLOTS = 4  # distinct LoRA adapters that get distinct embeddings (more wrap around)
MM_BASE = BASE_VOCAB * (1 + LORA_SLOTS)  # multimodal placeholder embeddings start here
VOCAB = MM_BASE + BASE_VOCAB


@dataclass(eq=False)
class OracleRequest(ScheduledRequest):
    """The oracle's own facts about a request: its LoRA embedding slot and its cached dense run."""

    lora_slot: int = 0
    dense: DenseRun | None = None
    placeholders: set[int] = field(default_factory=set)  # positions computed before their token was known

    def virtual(self, raw: Sequence[int]) -> tuple[int, ...]:
        """Model token ids: LoRA shifts the embedding range, multimodal positions use the item's."""
        base = BASE_VOCAB * self.lora_slot
        out = [base + t % BASE_VOCAB for t in raw]
        for m in self.rec.mm_features:
            h = zlib.crc32(m.identifier.encode())
            for p in range(m.offset, min(m.offset + m.length, len(out))):
                out[p] = MM_BASE + (h + p - m.offset) % BASE_VOCAB
        return tuple(out)
