"""The dense float64 reference: the same tiny model, run by transformers on a request's whole token
sequence, gives every layer's K (after the rotary embedding, as the paged cache stores it) and V at
every position, and the logits at every position.  Causal, so position p's K/V and logits depend on
tokens 0..p only: one run on the longest sequence seen answers every prefix of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DenseRun:
    """One float64 run on ``tokens``: ``keys[layer]`` and ``values[layer]`` are ``[T, kv_heads, head]``,
    ``logits`` is ``[T, vocab]``."""

    tokens: tuple[int, ...]
    keys: list[Any]
    values: list[Any]
    logits: Any


class DenseModel:
    """Model ``folder`` in float64 on the CPU, eager attention; ``run(tokens)`` memoised by prefix."""

    def __init__(self, folder: Path) -> None:
        import torch
        import transformers as _transformers

        transformers: Any = _transformers
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float64, attn_implementation="eager"
        ).eval()
        self.cache_class = transformers.DynamicCache
        self._runs: list[DenseRun] = []  # the latest runs, newest last (a few requests share prefixes)

    def run(self, tokens: tuple[int, ...]) -> DenseRun:
        """A run covering ``tokens`` (a run on a longer sequence with ``tokens`` as its prefix will do)."""
        for r in reversed(self._runs):
            if len(r.tokens) >= len(tokens) and r.tokens[: len(tokens)] == tokens:
                return r
        torch = self.torch
        with torch.no_grad():
            cache = self.cache_class()  # no config: every layer keeps every position (no window trimming)
            out = self.model(torch.tensor([tokens]), past_key_values=cache, use_cache=True)
        layers = out.past_key_values.layers
        run = DenseRun(
            tokens,
            [layer.keys[0].transpose(0, 1) for layer in layers],
            [layer.values[0].transpose(0, 1) for layer in layers],
            out.logits[0],
        )
        self._runs = [r for r in self._runs if not (r.tokens == tokens[: len(r.tokens)])][-31:] + [run]
        return run
