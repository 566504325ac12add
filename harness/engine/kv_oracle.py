"""The KV tensor oracle: what an engine's paged KV cache holds, read through the model runner's own
block tables, against the dense float64 recomputation (``dense.py``).

The cache's layout inside a block is the attention backend's business (the CPU backend stores K
transposed, per ISA); the oracle never assumes it.  ``learn_layout`` writes marked tokens into a
one-block scratch cache through the backend's own ``do_kv_cache_update`` and reads back where each
(token, head, dim) of K and of V landed: a gather index per layer shape, right on any backend that
writes through that method (the CPU one, FlashAttention on CUDA).

``poison`` fills every block the pool holds free and uncached with ``POISON`` after each engine step
(as vLLM's own kernel tests poison unused slots): a table pointing at a freed block then shows in the
KV read, and a kernel that attends to a position it was not given, in the outputs and the next
layer's K/V.  The poison is large but finite, not NaN: the CPU attention kernel scores a block's
unwritten tail slots and masks them afterwards, and a NaN there would spread although no wrong KV
is used (measured here with vLLM 0.32's CPU build: NaN poison turned every new block's first
position into NaN in the second layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """Where a block's (token, head, dim) of K and V live in the block's flattened storage."""

    key_index: Any  # LongTensor [block_size, kv_heads, head]
    value_index: Any


def learn_layout(layer: Any, cache: Any, block_size: int, kv_heads: int, head: int) -> Layout:
    """The layout of ``cache`` (one layer's paged cache) as ``layer.impl.do_kv_cache_update`` writes it."""
    import torch

    assert max(block_size, kv_heads, head) < 256, "marks must be exact in every cache dtype (bf16: 8 bits)"
    scratch = torch.zeros((1, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
    slots = torch.arange(block_size, dtype=torch.int64, device=cache.device)
    grid = torch.meshgrid(
        torch.arange(block_size), torch.arange(kv_heads), torch.arange(head), indexing="ij"
    )  # token, head, dim of each element of a [block_size, kv_heads, head] tensor

    def landed(which: int) -> Any:
        found = []
        for coord in grid:
            marks = (coord + 1).to(dtype=cache.dtype, device=cache.device)
            zeros = torch.zeros_like(marks)
            scratch.zero_()
            kv = (marks, zeros) if which == 0 else (zeros, marks)
            layer.impl.do_kv_cache_update(layer, kv[0], kv[1], scratch, slots)
            found.append(scratch.reshape(-1).to(torch.int64).cpu())
        index = torch.full((block_size, kv_heads, head), -1, dtype=torch.int64)
        where = (found[0] > 0).nonzero().flatten()
        index[found[0][where] - 1, found[1][where] - 1, found[2][where] - 1] = where
        if (index < 0).any():
            raise RuntimeError("the backend's KV write left some (token, head, dim) nowhere in the block")
        return index.to(cache.device)

    return Layout(landed(0), landed(1))


def read_kv(cache: Any, layout: Layout, table: list[int], positions: range, block_size: int) -> tuple[Any, Any]:
    """K and V at ``positions`` as the cache holds them, read through ``table`` (block ids by block
    index): two float64 tensors ``[len(positions), kv_heads, head]``."""
    import torch

    pos = torch.tensor(list(positions), dtype=torch.int64)
    blocks = torch.tensor([table[p // block_size] for p in positions], dtype=torch.int64, device=cache.device)
    flat = cache.reshape(cache.shape[0], -1)
    rows = flat[blocks]  # [P, block storage]
    within = (pos % block_size).to(cache.device)

    def gather(index: Any) -> Any:
        idx = index[within].reshape(len(pos), -1)  # [P, kv_heads * head]
        return rows.gather(1, idx).reshape(len(pos), *index.shape[1:]).to(torch.float64).cpu()

    return gather(layout.key_index), gather(layout.value_index)


POISON = 1.0e3
"""What a poisoned slot holds (module docstring): about a thousand times a real K/V element here."""


def poison(caches: list[Any], block_ids: list[int]) -> None:
    """``POISON`` into every slot of ``block_ids`` in every layer's cache."""
    if not block_ids:
        return
    import torch

    idx = torch.tensor(block_ids, dtype=torch.int64, device=caches[0].device)
    for cache in caches:
        cache.index_fill_(0, idx, POISON)
