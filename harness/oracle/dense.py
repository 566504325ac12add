"""The KV-content oracle's reference: the tiny model over a request's own tokens, with no cache.

``dense_reference`` is ``TinyTransformer.forward_dense`` in float64 that also keeps every layer's
K/V (what a correct paged cache must hold); ``row_errors`` compares paged numbers with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvspec.impl.paged.attention import dense_attention
from kvspec.impl.paged.model import TinyTransformer


@dataclass
class DenseRun:
    """``forward_dense`` of one token sequence, with each layer's K/V kept."""

    tokens: tuple[int, ...]
    hidden: torch.Tensor  # [N, d_model] float64
    k: list[torch.Tensor]  # per layer [N, Hkv, D] float64
    v: list[torch.Tensor]  # per layer [N, Hkv, D] float64


def dense_reference(model: TinyTransformer, tokens: Sequence[int]) -> DenseRun:
    """``TinyTransformer.forward_dense`` in float64, also returning every layer's K/V (same maths,
    step for step; a test checks the hidden states against ``forward_dense``).

    It uses the model's private ``_qkv`` / ``_finish`` (``impl.paged.model`` has no public per-layer
    K/V yet): the same functions ``forward_dense`` and ``forward_chunk`` run."""
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=model.device)  # [N]
    pos = torch.arange(ids.numel(), device=model.device)  # [N]
    x = model.embed[ids].to(torch.float64)  # [N, d_model]
    ks, vs = [], []
    for spec, wts in zip(model.config.layers, model.weights, strict=True):
        q, k, v = model._qkv(x, wts, pos)  # [N, Hq, D], [N, Hkv, D], [N, Hkv, D]
        ks.append(k)
        vs.append(v)
        attn = dense_attention(q, k, v, pos, spec.kind, spec.window)  # [N, Hq, D]
        x = model._finish(x, attn, wts)  # [N, d_model]
    return DenseRun(tuple(tokens), x, ks, vs)


def row_errors(
    actual: torch.Tensor, expected: torch.Tensor, tol: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Row-wise check of ``actual`` [P, ...] against ``expected`` [P, ...] (float64).

    Returns (bad rows [P] bool, NaN rows [P] bool, max abs error, max rel error); NaN counts as inf.
    """
    a = actual.to(torch.float64).reshape(actual.shape[0], -1)  # [P, F]
    e = expected.to(torch.float64).reshape(expected.shape[0], -1)  # [P, F]
    err = (a - e).abs()  # [P, F]
    nan = torch.isnan(err)  # [P, F]
    err = torch.where(nan, torch.full_like(err, math.inf), err)  # [P, F]
    bad = err > tol["atol"] + tol["rtol"] * e.abs()  # [P, F]
    if err.numel() == 0:
        return bad.any(-1), nan.any(-1), 0.0, 0.0
    rel = err / e.abs().clamp_min(1e-12)  # [P, F]
    return bad.any(-1), nan.any(-1), float(err.max()), float(rel.max())
