"""Numeric impact of the window bugs, measured with kvspec's torch oracle machinery on CPU.

``impl.paged.model.TinyTransformer`` (seeded, RoPE, GQA) runs the step vLLM schedules through a paged KV
cache whose block tables are the ones vLLM 0.33.0 hands the worker (reproduced by the tests next to
this file), and is compared with the dense float64 reference ``forward_dense`` over the same tokens:

- the attention output of every layer at the queries of that step (max abs error, relative L2);
- the logits of the first sampled token (``rms_norm(h) @ embed.T``, tied embeddings): relative L2 and
  largest absolute error, and whether the greedy token changes.

The prefill side computes every prompt token (the KV it sends is the dense KV up to float32); the
decode side's null block holds zeros (vLLM allocates KV memory zeroed) or, second figure, stale KV
another request wrote there.  The "fixed" row uses the table the proposed fix gives: its error is
float32 noise.  Run: ``.venv/bin/python tests/upstream/upstream_impact.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

import kvspec.impl.paged.model as model_module
from kvspec.impl.paged.model import LayerSpec, ModelConfig, TinyTransformer, rms_norm

NULL = 0


@dataclass(frozen=True)
class Impact:
    case: str
    attn_max_abs: float  # worst attention-output error of the step, any layer
    attn_rel: float  # its relative L2 error (per query row, worst)
    logits_rel: float  # relative L2 error of the first sampled token's logits
    logits_max_abs: float  # its largest absolute error
    argmax_changed: bool  # greedy sampling picks another token

    def row(self) -> str:
        return (
            f"| {self.case} | {self.attn_max_abs:.3g} | {self.attn_rel:.3g} | {self.logits_rel:.3g} | "
            f"{self.logits_max_abs:.3g} | {'yes' if self.argmax_changed else 'no'} |"
        )


@contextmanager
def recording() -> Iterator[dict[str, list[torch.Tensor]]]:
    """Record every attention output (paged and dense) per layer call, in call order."""
    seen: dict[str, list[torch.Tensor]] = {"paged": [], "dense": []}
    originals = {kind: getattr(model_module, f"{kind}_attention") for kind in seen}

    def rec(kind: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = fn(*args, **kwargs)
            seen[kind].append(out.detach().to(torch.float64))
            return out

        return wrapped

    for kind, fn in originals.items():  # impl.paged.model calls them through its module globals
        setattr(model_module, f"{kind}_attention", rec(kind, fn))
    try:
        yield seen
    finally:
        for kind, fn in originals.items():
            setattr(model_module, f"{kind}_attention", fn)


def make_model(layers: Sequence[LayerSpec], seed: int = 0) -> TinyTransformer:
    cfg = ModelConfig(
        vocab_size=256, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, layers=tuple(layers), seed=seed
    )
    return TinyTransformer(cfg, device="cpu")


def logits(m: TinyTransformer, hidden: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden.to(torch.float64)) @ m.embed.to(torch.float64).T  # [V]


def measure(
    case: str,
    m: TinyTransformer,
    tokens: Sequence[int],
    start: int,
    tables: Sequence[Sequence[int]],
    block: int,
    null_fill: str = "zeros",
    seed: int = 1,
) -> Impact:
    """The prefill side computes ``tokens[:start]`` into real blocks (ids ``1..``, one table per group);
    the decode side then runs ``tokens[start:]`` through ``tables`` (nulls where vLLM put them)."""
    n_blocks = -(-len(tokens) // block)
    real = [list(range(1 + g * n_blocks, 1 + (g + 1) * n_blocks)) for g in range(len(tables))]
    other = 1 + len(tables) * n_blocks  # a block of another request
    cache = m.new_cache(other + 1, [block] * len(tables))
    if start:
        m.forward_chunk(tokens[:start], 0, real, cache)
    m.forward_chunk(tokens_for(block, seed), 0, [[other]] * len(tables), cache)
    for layer in range(len(cache.k)):  # the null block: zeros, or KV another request left there
        cache.k[layer][NULL] = 0.0 if null_fill == "zeros" else cache.k[layer][other]
        cache.v[layer][NULL] = 0.0 if null_fill == "zeros" else cache.v[layer][other]
    with recording() as seen:
        ref_hidden = m.forward_dense(tokens)
        out = m.forward_chunk(tokens[start:], start, tables, cache)
    worst_abs, worst_rel = 0.0, 0.0
    for got, want in zip(seen["paged"], seen["dense"], strict=True):
        want = want[start:]
        err = (got - want).flatten(1)
        worst_abs = max(worst_abs, float(err.abs().max()))
        worst_rel = max(worst_rel, float((err.norm(dim=1) / want.flatten(1).norm(dim=1)).max()))
    ref, got_l = logits(m, ref_hidden[-1]), logits(m, out[-1])
    return Impact(
        case,
        worst_abs,
        worst_rel,
        float((got_l - ref).norm() / ref.norm()),
        float((got_l - ref).abs().max()),
        bool(ref.argmax() != got_l.argmax()),
    )


def nulled(table_len: int, nulls: int, group: int, block_count: int) -> list[int]:
    """The decode-side table of a group: ``nulls`` null entries, then the real block ids."""
    real = list(range(1 + group * block_count, 1 + (group + 1) * block_count))
    return [NULL] * nulls + real[nulls:table_len]


def tokens_for(n: int, seed: int = 7) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 256, (n,), generator=g)]


def full_load_sliding(W: int = 128, B: int = 16, P: int = 143, fixed: bool = False, null_fill: str = "zeros") -> Impact:
    """gpt-oss-like: layers alternate sliding window (group 1) and full attention (group 0)."""
    m = make_model([LayerSpec("sliding_window", W, 1), LayerSpec("full", None, 0)] * 2)
    n = -(-P // B)
    skip = (P - 1 if fixed else P) - W + 1
    tables = [nulled(n, 0, 0, n), nulled(n, max(0, skip) // B, 1, n)]
    what = "fixed" if fixed else f"null block = {null_fill}"
    return measure(
        f"full load, sliding window W={W} B={B} P={P}, {what}", m, tokens_for(P), P - 1, tables, B, null_fill
    )


def full_load_chunked(C: int = 64, B: int = 16, P: int = 128, fixed: bool = False, null_fill: str = "zeros") -> Impact:
    """Llama-4-like: three chunked-local layers (group 1) per full-attention layer (group 0)."""
    m = make_model([LayerSpec("chunked_local", C, 1)] * 3 + [LayerSpec("full", None, 0)])
    n = -(-P // B)
    skip = (P - 1 if fixed else P) // C * C
    tables = [nulled(n, 0, 0, n), nulled(n, skip // B, 1, n)]
    what = "fixed" if fixed else f"null block = {null_fill}"
    return measure(f"full load, chunked local C={C} B={B} P={P}, {what}", m, tokens_for(P), P - 1, tables, B, null_fill)


def invalid_block(W: int = 128, B: int = 16, T: int = 200, i: int = 5, fixed: bool = False) -> Impact:
    """Pure sliding window (one KV-cache group, as block-level recovery requires): the load of T
    tokens fails at block i; vLLM recomputes from i * B with the admission's nulls in place (the fix
    recomputes from scratch)."""
    m = make_model([LayerSpec("sliding_window", W, 0)] * 4)
    n = -(-T // B)
    if fixed:
        return measure(
            f"invalid block {i}, sliding window W={W} B={B} T={T}, fixed", m, tokens_for(T), 0, [nulled(n, 0, 0, n)], B
        )
    tables = [nulled(n, max(0, T - W + 1) // B, 0, n)]
    return measure(
        f"invalid block {i}, sliding window W={W} B={B} T={T}, null block = zeros", m, tokens_for(T), i * B, tables, B
    )


def chunk_not_multiple(C: int = 40, B: int = 16, T: int = 70, hit: int = 48, evicted: bool = True) -> Impact:
    """Llama-4-like (three chunked-local layers, group 1, per full-attention layer, group 0), the prefix
    hit the upstream test measures: 48 tokens cached in the full group, chunk start 40; the chunked
    group's block holding 40 was evicted, so vLLM starts at 32 with the chunked table ``[null, null,
    ...]``.  ``evicted=False``: that block is still cached and the step starts at 48."""
    m = make_model([LayerSpec("chunked_local", C, 1)] * 3 + [LayerSpec("full", None, 0)])
    n = -(-T // B)
    chunk_start = hit // C * C
    start = chunk_start // B * B if evicted else hit
    tables = [nulled(n, 0, 0, n), nulled(n, chunk_start // B, 1, n)]
    what = "chunked block at the chunk start evicted" if evicted else "all hit blocks cached"
    return measure(
        f"chunk not a block multiple C={C} B={B} T={T}, {what} (assert off)", m, tokens_for(T), start, tables, B
    )


def chunk_not_multiple_chunked_only(C: int = 40, B: int = 16, T: int = 41) -> Impact:
    """Every layer chunked-local, a fresh prompt: vLLM starts at ``h = (T - 1) // C * C // B * B`` with
    the nulls before it; only queries before the chunk start read them."""
    m = make_model([LayerSpec("chunked_local", C, 0)] * 4)
    n = -(-T // B)
    h = (T - 1) // C * C // B * B
    return measure(
        f"chunk not a block multiple C={C} B={B} T={T}, chunked-local only (assert off)",
        m,
        tokens_for(T),
        h,
        [nulled(n, h // B, 0, n)],
        B,
    )


def all_cases() -> list[Impact]:
    return [
        full_load_sliding(),
        full_load_sliding(null_fill="stale"),
        full_load_sliding(fixed=True),
        full_load_sliding(W=128, P=159),
        full_load_chunked(),
        full_load_chunked(null_fill="stale"),
        full_load_chunked(fixed=True),
        invalid_block(),
        invalid_block(fixed=True),
        chunk_not_multiple(),
        chunk_not_multiple(evicted=False),
        chunk_not_multiple_chunked_only(),
    ]


if __name__ == "__main__":
    torch.manual_seed(0)
    print(
        "| case | attention max abs err | attention rel err | logits rel err | logits max abs err "
        "| greedy token changes |"
    )
    print("|---|---|---|---|---|---|")
    for impact in all_cases():
        assert not math.isnan(impact.logits_rel), impact
        print(impact.row())
