"""The KV-content oracle's model and paged cache for one config: K/V writes, reads, poisoning.

Layers: each decoder KV-cache group gets ``layers_per_group`` layers of its attention kind (full,
sliding window ``W``, chunked local ``C``), interleaved group by group so that every group's KV
depends on every group's earlier layers.  Cross-attention groups get no layer (their KV comes from
an encoder the tiny model does not have); their block ids still take part in poisoning.

The cache starts NaN-filled; ``written`` is the set of blocks holding anything but NaN, and
``poison`` refills blocks with NaN so that a later read of them can never pass a comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from kvspec.harness.core.observation import Observation
from kvspec.harness.oracle.dense import DenseRun, row_errors
from kvspec.harness.oracle.finding import BadKV
from kvspec.harness.targets.base import Unsupported
from kvspec.impl.paged.kv_cache import slot_mapping
from kvspec.impl.paged.model import LayerSpec, ModelConfig, TinyTransformer
from kvspec.spec.config import KVCacheConfig

# Positions of one layer to compare: (layer spec, the request's table in its group, block size).
PositionsOf = Callable[[LayerSpec, Sequence[int], int], list[int]]


def _window(spec: Any) -> int | None:
    if spec.kind == "sliding_window":
        return int(spec.sliding_window)
    if spec.kind == "chunked_local":
        return int(spec.attention_chunk_size)
    return None


class PagedKV:
    """The tiny model built for ``config`` and its paged K/V cache (``poison=False``: no NaN refills)."""

    def __init__(
        self,
        config: KVCacheConfig,
        vocab_size: int,
        device: torch.device,
        dtype: torch.dtype,
        tol: dict[str, float],
        *,
        model_seed: int,
        layers_per_group: int,
        poison: bool,
    ) -> None:
        decoder = [g for g, spec in enumerate(config.groups) if spec.kind != "cross"]
        if not decoder:
            raise Unsupported("kv-check: every KV-cache group is cross-attention; the oracle models decoder layers")
        layers = tuple(
            LayerSpec(config.groups[g].kind, _window(config.groups[g]), g)
            for _ in range(layers_per_group)
            for g in decoder
        )
        if len(layers) < 2:  # the model needs two layers so that KV depends on the prefix
            layers = layers * 2
        self.model = TinyTransformer(ModelConfig(vocab_size=vocab_size, layers=layers, seed=model_seed), device=device)
        self.device = device
        self.dtype = dtype
        self.tol = tol
        self.poison_enabled = poison
        self.num_blocks = config.num_blocks
        self.block_sizes = [g.block_size for g in config.groups]
        self.cache = self.model.new_cache(config.num_blocks, self.block_sizes, dtype)
        self.layers: list[tuple[int, LayerSpec]] = list(enumerate(self.model.config.layers))
        self.written: set[int] = set()  # blocks holding anything but NaN

    # --- writes ----------------------------------------------------------------------------------

    def forward(self, tokens: Sequence[int], start: int, tables: list[tuple[int, ...]]) -> torch.Tensor:
        """The paged model runner: positions ``start ..`` of one request, writing their K/V through
        ``tables`` (one per group) and attending through them.  Returns [T, d_model]."""
        n = start + len(tokens)
        out = self.model.forward_chunk(tokens, start, [t if t else (0,) for t in tables], self.cache, self.dtype)
        for _, spec in self.layers:
            bs = self.block_sizes[spec.group]
            self.written.update(tables[spec.group][p // bs] for p in range(start, n))
        return out

    def load(self, tables: list[tuple[int, ...]], a: int, b: int, d: DenseRun) -> None:
        """A KV connector writes the dense KV of positions ``[a, b)`` (skipping positions mapped to
        the null block: out of the window)."""
        for layer, spec in self.layers:
            g, bs = spec.group, self.block_sizes[spec.group]
            table = tables[g]
            pos = [p for p in range(a, b) if table[p // bs] != 0]
            if not pos:
                continue
            t = torch.as_tensor(table, dtype=torch.long, device=self.device)  # [n_blocks]
            pt = torch.as_tensor(pos, dtype=torch.long, device=self.device)  # [P]
            self.cache.write(layer, t, pt, d.k[layer][pt], d.v[layer][pt])
            self.written.update(table[p // bs] for p in pos)

    # --- reads -----------------------------------------------------------------------------------

    def read_kv(self, layer: int, table: Sequence[int], pos: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [P, Hkv, D] stored for token positions ``pos`` through ``table``."""
        bs = self.cache.block_sizes[layer]
        t = torch.as_tensor(table, dtype=torch.long, device=self.device)  # [n_blocks]
        slots = slot_mapping(t, torch.as_tensor(pos, dtype=torch.long, device=self.device), bs)  # [P]
        kc = self.cache.k[layer].view(-1, *self.cache.k[layer].shape[2:])  # [num_blocks * bs, Hkv, D]
        vc = self.cache.v[layer].view(-1, *self.cache.v[layer].shape[2:])  # [num_blocks * bs, Hkv, D]
        return kc[slots], vc[slots]

    def compare_kv(
        self, tables: list[tuple[int, ...]], d: DenseRun, positions_of: PositionsOf, hi: int
    ) -> tuple[list[BadKV], float, float]:
        """Compare stored K/V with the dense K/V, per layer, for the positions below ``hi`` that
        ``positions_of`` gives.  Returns the bad slots per block and the largest errors."""
        bad_kv: list[BadKV] = []
        max_abs = max_rel = 0.0
        for layer, spec in self.layers:
            g, bs = spec.group, self.block_sizes[spec.group]
            table = tables[g]
            pos = [p for p in positions_of(spec, table, bs) if p < hi]
            if not pos:
                continue
            k, v = self.read_kv(layer, table, pos)
            pt = torch.as_tensor(pos, dtype=torch.long, device=self.device)  # [P]
            bk, nk, ak, rk = row_errors(k, d.k[layer][pt], self.tol)
            bv, nv, av, rv = row_errors(v, d.v[layer][pt], self.tol)
            max_abs, max_rel = max(max_abs, ak, av), max(max_rel, rk, rv)
            per_block: dict[int, BadKV] = {}
            for p, is_bad, is_nan in zip(pos, (bk | bv).tolist(), (nk | nv).tolist(), strict=True):
                if is_bad:
                    b = table[p // bs]
                    entry = per_block.setdefault(b, BadKV(layer, g, b, [], True))
                    entry.positions.append(p)
                    entry.nan = entry.nan and is_nan
            bad_kv.extend(per_block.values())
        return bad_kv, max_abs, max_rel

    # --- poisoning -------------------------------------------------------------------------------

    def poison(self, blocks: Iterable[int]) -> int:
        """Fill the written ones of ``blocks`` with NaN; returns how many were poisoned."""
        todo = sorted(b for b in blocks if b in self.written)
        if not todo or not self.poison_enabled:
            return 0
        self.cache.poison(todo)
        self.written.difference_update(todo)
        return len(todo)

    def poison_released(self, obs: Observation) -> int:
        """Blocks with no reference and no hash can never be read again: fill them with NaN."""
        secondary = getattr(obs, "secondary_keys", None) or {}
        return self.poison(
            b for b in self.written if obs.ref_cnt[b] <= 0 and obs.block_key[b] is None and b not in secondary
        )
