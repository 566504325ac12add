"""Attention over a paged KV cache, its dense reference, and (CUDA + Triton only) a fused kernel.

Masks (query at position ``p``, key at position ``j``; vLLM 0.33 attention kinds):
- ``full``: ``j <= p``;
- ``sliding_window`` W: ``p - W + 1 <= j <= p``;
- ``chunked_local`` C: ``j // C == p // C`` and ``j <= p``.

``paged_attention`` is the plain torch path: it gathers only the key positions some query of the
chunk can see (so the null block standing in for out-of-window positions is never read), then
computes masked softmax attention in float32 (or the caller's wider dtype).  ``dense_attention``
is the same maths on a contiguous K/V of the whole sequence, without any cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from kvspec.impl.paged.kv_cache import slot_mapping


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, kind: str, window: int | None = None) -> torch.Tensor:
    """[T] query positions x [S] key positions -> [T, S] bool (True = attend)."""
    qp = q_pos[:, None]  # [T, 1]
    kp = k_pos[None, :]  # [1, S]
    causal = kp <= qp  # [T, S]
    if kind == "full":
        return causal
    if window is None or window < 1:
        raise ValueError(f"{kind} attention needs a positive window/chunk size, got {window!r}")
    if kind == "sliding_window":
        return causal & (kp > qp - window)  # [T, S]
    if kind == "chunked_local":
        return causal & (torch.div(kp, window, rounding_mode="floor") == torch.div(qp, window, rounding_mode="floor"))
    raise ValueError(f"unknown attention kind {kind!r}")


def first_visible_position(p: int, kind: str, window: int | None) -> int:
    """The lowest key position a query at ``p`` attends to."""
    if kind == "full":
        return 0
    if window is None:
        raise ValueError(f"{kind} attention needs a window/chunk size")
    if kind == "sliding_window":
        return max(0, p - window + 1)
    return (p // window) * window


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, compute_dtype: torch.dtype
) -> torch.Tensor:
    """q [T, Hq, D], k/v [S, Hkv, D], mask [T, S] -> [T, Hq, D] (GQA by repeating K/V heads)."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads is not a multiple of {hkv} KV heads")
    rep = hq // hkv
    qf = q.to(compute_dtype)  # [T, Hq, D]
    kf = k.to(compute_dtype).repeat_interleave(rep, dim=1)  # [S, Hq, D]
    vf = v.to(compute_dtype).repeat_interleave(rep, dim=1)  # [S, Hq, D]
    scores = torch.einsum("thd,shd->hts", qf, kf) / math.sqrt(q.shape[-1])  # [Hq, T, S]
    scores = scores.masked_fill(~mask[None], float("-inf"))  # [Hq, T, S]
    probs = torch.softmax(scores, dim=-1)  # [Hq, T, S]
    return torch.einsum("hts,shd->thd", probs, vf)  # [T, Hq, D]


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, kind: str, window: int | None = None
) -> torch.Tensor:
    """Reference: q [T, Hq, D] at positions q_pos [T]; k/v [S, Hkv, D] for positions 0..S-1."""
    k_pos = torch.arange(k.shape[0], device=k.device)  # [S]
    mask = attention_mask(q_pos, k_pos, kind, window)  # [T, S]
    return _attend(q, k, v, mask, torch.promote_types(q.dtype, torch.float32))  # [T, Hq, D]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
    kind: str,
    window: int | None = None,
) -> torch.Tensor:
    """Torch paged attention for a chunk of one request.

    q [T, Hq, D] are the queries of positions ``start .. start+T-1``; k_cache/v_cache
    [num_blocks, block_size, Hkv, D]; block_table [num_table_blocks] int64.  The chunk's own K/V
    must already be written.  Returns [T, Hq, D].
    """
    t = q.shape[0]
    bs = k_cache.shape[1]
    lo = first_visible_position(start, kind, window)
    k_pos = torch.arange(lo, start + t, device=q.device)  # [S] visible key positions
    slots = slot_mapping(block_table, k_pos, bs)  # [S]
    k = k_cache.view(-1, *k_cache.shape[2:])[slots]  # [S, Hkv, D]
    v = v_cache.view(-1, *v_cache.shape[2:])[slots]  # [S, Hkv, D]
    q_pos = torch.arange(start, start + t, device=q.device)  # [T]
    mask = attention_mask(q_pos, k_pos, kind, window)  # [T, S]
    return _attend(q, k, v, mask, torch.promote_types(q.dtype, torch.float32)).to(q.dtype)  # [T, Hq, D]


# --- fused kernel (CUDA + Triton) ----------------------------------------------------------------


def triton_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


class PagedAttentionKernel(Protocol):
    """What the launcher needs of the ``@triton.jit`` kernel: ``kernel[grid](*args, **constexprs)``."""

    def __getitem__(self, grid: tuple[int, int]) -> Callable[..., object]: ...


_KERNEL: PagedAttentionKernel | None = None


def _build_kernel() -> PagedAttentionKernel:  # pragma: no cover - needs Triton
    import triton
    import triton.language as tl  # type: ignore[import-untyped]

    @triton.jit  # type: ignore[untyped-decorator]
    def paged_attn_kernel(  # type: ignore[no-untyped-def]  # Triton reads parameter annotations
        q_ptr,
        k_ptr,
        v_ptr,
        bt_ptr,
        out_ptr,
        start,
        lo_base,
        kind,
        window,
        scale,
        stride_qt,
        stride_qh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_ot,
        stride_oh,
        BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        GROUP: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        # one program per (query token, query head); online softmax over key tiles of BLOCK_N
        t = tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // GROUP
        p = start + t
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d).to(tl.float32)  # [D]
        lo = tl.where(kind == 1, tl.maximum(p - window + 1, 0), tl.where(kind == 2, (p // window) * window, 0))
        lo = tl.maximum(lo, lo_base)
        m = -float("inf")
        l_sum = 0.0
        acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
        for n0 in range(lo, p + 1, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)  # [BLOCK_N]
            valid = pos <= p
            blk = tl.load(bt_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            off = blk * stride_kb + (pos % BLOCK_SIZE).to(tl.int64) * stride_ks + kvh * stride_kh
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale  # [BLOCK_N]
            s = tl.where(valid, s, -float("inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            alpha = tl.exp(m - m_new)
            pr = tl.exp(s - m_new)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(pr[:, None] * v, axis=0)
            l_sum = l_sum * alpha + tl.sum(pr, axis=0)
            m = m_new
        out = acc / l_sum
        tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))

    kernel: PagedAttentionKernel = paged_attn_kernel
    return kernel


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
    kind: str,
    window: int | None = None,
) -> torch.Tensor:  # pragma: no cover - needs CUDA and Triton
    """Fused Triton paged attention; same contract as ``paged_attention`` (its reference)."""
    global _KERNEL
    if not triton_available():
        raise RuntimeError("the Triton kernel needs CUDA and the triton package")
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    return launch_paged_attention_kernel(_KERNEL, q, k_cache, v_cache, block_table, start, kind, window)


def launch_paged_attention_kernel(
    kernel: PagedAttentionKernel,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: int,
    kind: str,
    window: int | None = None,
) -> torch.Tensor:
    """Launch ``_build_kernel()``'s kernel (compiled for CUDA, or interpreted on CPU under
    ``TRITON_INTERPRET=1``, which is how CI checks its logic without a GPU)."""
    t, hq, d = q.shape
    nb, bs, hkv, _ = k_cache.shape
    if d & (d - 1):
        raise ValueError(f"head_dim must be a power of two for the Triton kernel, got {d}")
    q = q.contiguous()  # [T, Hq, D]
    out = torch.empty_like(q)  # [T, Hq, D]
    kind_id = {"full": 0, "sliding_window": 1, "chunked_local": 2}[kind]
    kernel[(t, hq)](
        q,
        k_cache,
        v_cache,
        block_table.to(torch.int32).contiguous(),
        out,
        start,
        0,
        kind_id,
        window or 1,
        1.0 / math.sqrt(d),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(1),
        BLOCK_SIZE=bs,
        HEAD_DIM=d,
        GROUP=hq // hkv,
        BLOCK_N=32,
    )
    return out
