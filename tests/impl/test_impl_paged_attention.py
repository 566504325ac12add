"""Paged attention and the paged model runner against the dense, cache-free float64 reference."""

from __future__ import annotations

import random

import pytest
import torch

from kvspec.impl.paged.attention import dense_attention, paged_attention, paged_attention_triton, triton_available
from kvspec.impl.paged.kv_cache import PagedKVCache, slot_mapping
from kvspec.impl.paged.model import LayerSpec, ModelConfig, TinyTransformer, tolerance

KINDS = [("full", None), ("sliding_window", 5), ("chunked_local", 8)]
TOL = tolerance(torch.float32)


def test_slot_mapping_formula():
    table = torch.tensor([7, 3, 9])
    pos = torch.tensor([0, 3, 4, 9, 11])
    assert slot_mapping(table, pos, 4).tolist() == [28, 31, 12, 37, 39]
    with pytest.raises(IndexError):
        slot_mapping(table, torch.tensor([12]), 4)


def _random_kv(seq: int, hkv: int = 2, hq: int = 4, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, hq, d, generator=g)  # [S, Hq, D]
    k = torch.randn(seq, hkv, d, generator=g)  # [S, Hkv, D]
    v = torch.randn(seq, hkv, d, generator=g)  # [S, Hkv, D]
    return q, k, v


def _fill(cache: PagedKVCache, table: list[int], k: torch.Tensor, v: torch.Tensor, upto: int) -> torch.Tensor:
    t = torch.tensor(table)  # [n_blocks]
    cache.write(0, t, torch.arange(upto), k[:upto], v[:upto])
    return t


@pytest.mark.parametrize("kind, window", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_paged_equals_dense_random_tables(kind, window, seed):
    """Shuffled block ids, a prefix block shared with another request, chunks of every size."""
    rng = random.Random(seed)
    bs, seq = 4, 29
    q, k, v = _random_kv(seq, seed=seed)
    cache = PagedKVCache(1, 64, bs, 2, 8, device="cpu")
    ids = list(range(1, 64))
    rng.shuffle(ids)
    table_a = ids[:8]
    table_b = table_a[:2] + ids[8:14]  # shares the first two (full) blocks with table_a
    ta = _fill(cache, table_a, k, v, seq)
    tb = torch.tensor(table_b)
    cache.write(0, tb, torch.arange(8, seq), k[8:], v[8:])  # b's own tail, same contents
    ref = dense_attention(q.double(), k.double(), v.double(), torch.arange(seq), kind, window)  # [S, Hq, D]
    start = rng.randrange(seq)
    for table in (ta, tb):
        out = paged_attention(q[start:], cache.k[0], cache.v[0], table, start, kind, window)  # [S-start, Hq, D]
        torch.testing.assert_close(out.double(), ref[start:], **TOL)


@pytest.mark.parametrize("kind, window", KINDS)
def test_reading_a_poisoned_slot_fails(kind, window):
    """Teeth: a visible slot whose block was freed (NaN) must break the comparison."""
    bs, seq = 4, 16
    q, k, v = _random_kv(seq)
    cache = PagedKVCache(1, 32, bs, 2, 8, device="cpu")
    table = [5, 9, 2, 17]
    t = _fill(cache, table, k, v, seq)
    ref = dense_attention(q.double(), k.double(), v.double(), torch.arange(seq), kind, window)
    out = paged_attention(q[15:], cache.k[0], cache.v[0], t, 15, kind, window)
    torch.testing.assert_close(out.double(), ref[15:], **TOL)  # sanity: clean cache passes
    cache.poison([17])  # the block holding positions 12..15, visible to position 15 in every kind
    bad = paged_attention(q[15:], cache.k[0], cache.v[0], t, 15, kind, window)
    assert torch.isnan(bad).any()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(bad.double(), ref[15:], **TOL)


def test_never_written_slot_is_nan():
    cache = PagedKVCache(1, 4, 2, 1, 2, device="cpu")
    assert torch.isnan(cache.k[0]).all() and torch.isnan(cache.v[0]).all()


def _model() -> TinyTransformer:
    cfg = ModelConfig(
        layers=(LayerSpec("full", None, 0), LayerSpec("sliding_window", 6, 1), LayerSpec("chunked_local", 8, 2))
    )
    return TinyTransformer(cfg, device="cpu")


def test_chunked_prefill_then_decode_equals_dense():
    """Three KV groups with shuffled tables; chunked prefill, then decode token by token."""
    m = _model()
    rng = random.Random(1)
    tokens = [rng.randrange(64) for _ in range(40)]
    cache = m.new_cache(80, [4, 4, 4])
    ids = list(range(1, 80))
    rng.shuffle(ids)
    tables = [ids[0:10], ids[10:20], ids[20:30]]
    ref = m.forward_dense(tokens)  # [40, d_model] float64
    outs, s = [], 0
    for n in (13, 8, 11, 1, 1, 1, 1, 1, 1, 1, 1):
        outs.append(m.forward_chunk(tokens[s : s + n], s, tables, cache))
        s += n
    torch.testing.assert_close(torch.cat(outs).double(), ref, **TOL)


def test_kv_depends_on_whole_prefix():
    """Teeth for the model: changing token 0 changes layer-1 K/V of a later token."""
    m = _model()
    a, b = [1] * 12, [2] + [1] * 11
    ca, cb = m.new_cache(8, [4, 4, 4]), m.new_cache(8, [4, 4, 4])
    tables = [[1, 2, 3], [4, 5, 6], [1, 2, 3]]
    m.forward_chunk(a, 0, tables, ca)
    m.forward_chunk(b, 0, tables, cb)
    assert not torch.allclose(ca.k[1][6, 3], cb.k[1][6, 3])  # layer 1 (SWA), position 11


def test_stale_block_in_table_is_caught():
    """A table pointing at another request's block (wrong id) must not match the reference."""
    m = _model()
    tokens = list(range(20))
    other = list(range(30, 50))
    cache = m.new_cache(40, [4, 4, 4])
    good = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    wrong = [[16, 17, 18, 19, 20]] + good[1:]
    m.forward_chunk(other, 0, wrong, cache)  # another request fills blocks 16..20
    m.forward_chunk(tokens[:16], 0, good, cache)
    out = m.forward_chunk(tokens[16:], 16, [[16, 17, 18, 19, 5]] + good[1:], cache)  # prefix blocks wrong
    ref = m.forward_dense(tokens)[16:]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out.double(), ref, **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CI has no GPU; run ci/gpu-check)")
@pytest.mark.parametrize("kind, window", KINDS)
def test_triton_kernel_matches_torch_path(kind, window):  # pragma: no cover - GPU only
    if not triton_available():
        pytest.skip("triton is not installed")
    rng = random.Random(0)
    bs, seq, nb = 16, 300, 32768
    q, k, v = (x.cuda() for x in _random_kv(seq, hkv=2, hq=8, d=64))
    cache = PagedKVCache(1, nb, bs, 2, 64, device="cuda")
    table = torch.tensor(rng.sample(range(1, nb), -(-seq // bs)), device="cuda")
    cache.write(0, table, torch.arange(seq, device="cuda"), k, v)
    ref = paged_attention(q[200:], cache.k[0], cache.v[0], table, 200, kind, window)
    out = paged_attention_triton(q[200:], cache.k[0], cache.v[0], table, 200, kind, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
