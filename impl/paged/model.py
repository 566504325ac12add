"""A tiny seeded decoder-only transformer with a paged-KV runner and a dense no-cache reference.

Each layer: RMS norm -> grouped-query attention with rotary positions -> residual -> RMS norm ->
SiLU MLP -> residual.  Because layer ``l + 1``'s K/V are computed from layer ``l``'s output, the
KV of a token depends on its whole visible prefix, so a wrong block id, a stale block or a missing
token anywhere upstream changes the numbers.

``forward_chunk`` runs a chunk of new tokens of one request against the paged cache (writing the
chunk's K/V into the slots its block tables map, then attending through the tables);
``forward_dense`` recomputes the whole sequence from scratch (float64 by default) with no cache.
Each layer has an attention kind (``full``, ``sliding_window`` W, ``chunked_local`` C) and belongs
to a KV-cache group whose block table it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvspec.impl.paged.attention import dense_attention, paged_attention, paged_attention_triton
from kvspec.impl.paged.kv_cache import PagedKVCache, default_device


@dataclass(frozen=True)
class LayerSpec:
    kind: str = "full"  # full | sliding_window | chunked_local
    window: int | None = None  # W or C
    group: int = 0  # KV-cache group (block table) this layer reads


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    d_model: int = 32
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    layers: tuple[LayerSpec, ...] = (LayerSpec(), LayerSpec())
    rope_base: float = 10000.0
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.layers) < 2:
            raise ValueError("the model needs at least two layers (so KV depends on the prefix)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")


def rope(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form): x [T, H, D] at positions pos [T] -> [T, H, D]."""
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(half, dtype=x.dtype, device=x.device) / half)  # [D/2]
    ang = pos.to(x.dtype)[:, None] * inv[None, :]  # [T, D/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]  # [T, 1, D/2]
    x1, x2 = x[..., :half], x[..., half:]  # [T, H, D/2] each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # [T, H, D]


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # [T, d_model]


class TinyTransformer:
    """Seeded weights (float32 master copy); no autograd, no nn.Module state to manage."""

    def __init__(self, config: ModelConfig = ModelConfig(), device: torch.device | str | None = None) -> None:
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        c = config
        g = torch.Generator().manual_seed(c.seed)

        def w(*shape: int) -> torch.Tensor:
            scale: float = shape[0] ** 0.5  # annotated: typeshed types ``int ** float`` as Any
            return (torch.randn(*shape, generator=g) / scale).to(self.device)

        vocab_scale: float = c.vocab_size**0.5
        self.embed = w(c.vocab_size, c.d_model) * vocab_scale  # [V, d_model]
        self.weights = [
            dict(
                wq=w(c.d_model, c.num_heads * c.head_dim),  # [d_model, Hq*D]
                wk=w(c.d_model, c.num_kv_heads * c.head_dim),  # [d_model, Hkv*D]
                wv=w(c.d_model, c.num_kv_heads * c.head_dim),  # [d_model, Hkv*D]
                wo=w(c.num_heads * c.head_dim, c.d_model),  # [Hq*D, d_model]
                w1=w(c.d_model, 2 * c.d_model),  # [d_model, 2*d_model]
                w2=w(2 * c.d_model, c.d_model),  # [2*d_model, d_model]
            )
            for _ in c.layers
        ]

    def _qkv(
        self, x: torch.Tensor, wts: dict[str, torch.Tensor], pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        h = rms_norm(x)  # [T, d_model]
        q = (h @ wts["wq"].to(x.dtype)).view(-1, c.num_heads, c.head_dim)  # [T, Hq, D]
        k = (h @ wts["wk"].to(x.dtype)).view(-1, c.num_kv_heads, c.head_dim)  # [T, Hkv, D]
        v = (h @ wts["wv"].to(x.dtype)).view(-1, c.num_kv_heads, c.head_dim)  # [T, Hkv, D]
        return rope(q, pos, c.rope_base), rope(k, pos, c.rope_base), v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor, wts: dict[str, torch.Tensor]) -> torch.Tensor:
        x = x + attn.reshape(x.shape[0], -1) @ wts["wo"].to(x.dtype)  # [T, d_model]
        h = rms_norm(x)  # [T, d_model]
        return x + torch.nn.functional.silu(h @ wts["w1"].to(x.dtype)) @ wts["w2"].to(x.dtype)  # [T, d_model]

    def forward_dense(self, tokens: Sequence[int], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Reference: the whole sequence, no cache -> hidden states [N, d_model] in ``dtype``."""
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)  # [N]
        pos = torch.arange(ids.numel(), device=self.device)  # [N]
        x = self.embed[ids].to(dtype)  # [N, d_model]
        for spec, wts in zip(self.config.layers, self.weights, strict=True):
            q, k, v = self._qkv(x, wts, pos)  # [N, Hq, D], [N, Hkv, D], [N, Hkv, D]
            attn = dense_attention(q, k, v, pos, spec.kind, spec.window)  # [N, Hq, D]
            x = self._finish(x, attn, wts)  # [N, d_model]
        return x

    def new_cache(
        self, num_blocks: int, block_sizes: Sequence[int], dtype: torch.dtype = torch.float32
    ) -> PagedKVCache:
        """A NaN-poisoned cache; ``block_sizes[g]`` is KV group ``g``'s block size."""
        c = self.config
        per_layer = [block_sizes[s.group] for s in c.layers]
        return PagedKVCache(len(c.layers), num_blocks, per_layer, c.num_kv_heads, c.head_dim, dtype, self.device)

    def forward_chunk(
        self,
        tokens: Sequence[int],
        start: int,
        block_tables: Sequence[Sequence[int]],
        cache: PagedKVCache,
        dtype: torch.dtype = torch.float32,
        use_triton: bool = False,
    ) -> torch.Tensor:
        """Run tokens at positions ``start ..`` of one request through the paged cache.

        ``block_tables[g]`` is the request's table in KV group ``g`` (0 = null placeholder).
        Writes the chunk's K/V, then attends through the tables.  Returns [T, d_model] in ``dtype``.
        """
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)  # [T]
        pos = torch.arange(start, start + ids.numel(), device=self.device)  # [T]
        tables = [torch.as_tensor(list(t), dtype=torch.long, device=self.device) for t in block_tables]  # [n_g] each
        attend = paged_attention_triton if use_triton else paged_attention
        x = self.embed[ids].to(dtype)  # [T, d_model]
        for layer, (spec, wts) in enumerate(zip(self.config.layers, self.weights, strict=True)):
            q, k, v = self._qkv(x, wts, pos)  # [T, Hq, D], [T, Hkv, D], [T, Hkv, D]
            cache.write(layer, tables[spec.group], pos, k, v)
            attn = attend(
                q, cache.k[layer], cache.v[layer], tables[spec.group], start, spec.kind, spec.window
            )  # [T, Hq, D]
            x = self._finish(x, attn.to(dtype), wts)  # [T, d_model]
        return x


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Comparison tolerances per dtype (``rtol`` / ``atol`` for ``torch.testing.assert_close``)."""
    if dtype == torch.float64:
        return {"rtol": 1e-9, "atol": 1e-9}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    if dtype == torch.float16:
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": 1.5e-2}
    raise ValueError(f"no tolerance for {dtype}")
