"""A paged KV store in torch: one ``[num_blocks, block_size, num_kv_heads, head_dim]`` cache per layer.

Token ``t`` of a request whose block table is ``table`` lives in slot
``slot = table[t // block_size] * block_size + t % block_size`` of the flattened cache
(vLLM 0.33 ``slot_mapping``).  Every slot starts poisoned with NaN, and ``poison`` re-poisons the
blocks the allocator frees: a read of a slot that was never written (or was freed) turns the
attention output into NaN, so it can never pass a comparison by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def default_device() -> torch.device:
    """CUDA when present, CPU otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """``table[t // bs] * bs + t % bs`` for each token position ``t``.

    ``block_table``: [num_table_blocks] int64; ``positions``: [T] int64 -> [T] int64 slots.
    """
    if positions.numel() and int(positions.max()) >= block_table.numel() * block_size:
        raise IndexError(
            f"position {int(positions.max())} is beyond the block table ({block_table.numel()} blocks of {block_size})"
        )
    block_idx = torch.div(positions, block_size, rounding_mode="floor")  # [T]
    return block_table[block_idx] * block_size + positions % block_size  # [T]


class PagedKVCache:
    """Per-layer paged K/V caches with NaN poisoning."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_sizes: int | Sequence[int],
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if num_layers < 1 or num_blocks < 1:
            raise ValueError(f"need >= 1 layer and >= 1 block, got {num_layers} layers, {num_blocks} blocks")
        sizes = [block_sizes] * num_layers if isinstance(block_sizes, int) else list(block_sizes)
        if len(sizes) != num_layers:
            raise ValueError(f"{len(sizes)} block sizes for {num_layers} layers")
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype
        self.num_blocks = num_blocks
        self.block_sizes = sizes
        self.k = [
            torch.full((num_blocks, bs, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=self.device)
            for bs in sizes
        ]  # per layer: [num_blocks, block_size, num_kv_heads, head_dim]
        self.v = [torch.full_like(k, float("nan")) for k in self.k]  # same shape as k

    def write(
        self, layer: int, block_table: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write ``k``/``v`` ([T, num_kv_heads, head_dim]) of tokens at ``positions`` ([T])."""
        bs = self.block_sizes[layer]
        slots = slot_mapping(block_table, positions, bs)  # [T]
        kc = self.k[layer].view(-1, *self.k[layer].shape[2:])  # [num_blocks * bs, H_kv, D]
        vc = self.v[layer].view(-1, *self.v[layer].shape[2:])  # [num_blocks * bs, H_kv, D]
        kc[slots] = k.to(self.dtype)  # [T, H_kv, D] scattered into slots
        vc[slots] = v.to(self.dtype)  # [T, H_kv, D]

    def poison(self, block_ids: Sequence[int], layers: Sequence[int] | None = None) -> None:
        """Fill the given blocks with NaN (freed or never-written blocks must not be read)."""
        if not block_ids:
            return
        ids = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.device)  # [n]
        for layer in range(len(self.k)) if layers is None else layers:
            self.k[layer][ids] = float("nan")  # [n, bs, H_kv, D]
            self.v[layer][ids] = float("nan")  # [n, bs, H_kv, D]
