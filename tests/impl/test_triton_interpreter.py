"""The fused Triton paged-attention kernel against its torch reference, without a GPU: Triton's
interpreter (``TRITON_INTERPRET=1``) runs the kernel's own code on CPU tensors.  Shuffled block
tables with ids near the top of a large pool, all three attention kinds.  (Speed, fp16/bf16 and
the compiled CUDA path are ``ci/gpu-check``'s job.)"""

import os
import random

import pytest
import torch

if torch.cuda.is_available():  # the compiled kernel is checked by test_impl_paged_attention / ci/gpu-check
    pytest.skip("CUDA present: the compiled kernel is tested instead", allow_module_level=True)
# Triton chooses the interpreter when it is imported; without CUDA nothing else uses Triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kvspec.impl.paged import attention as A  # noqa: E402

CASES = [
    ("full", None),
    ("sliding_window", 1),
    ("sliding_window", 7),
    ("sliding_window", 16),
    ("chunked_local", 4),
    ("chunked_local", 8),
]


@pytest.mark.parametrize("kind, window", CASES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_interpreted_kernel_matches_torch_paged_attention(kind, window, block_size):
    kernel = A._build_kernel()
    rng = random.Random(f"{kind}-{window}-{block_size}")  # a str seed is stable across processes
    torch.manual_seed(rng.randrange(1 << 30))
    num_blocks, hq, hkv, d = 40_000, 4, 2, 16
    k_cache = torch.randn(num_blocks, block_size, hkv, d)  # [N, bs, Hkv, D]
    v_cache = torch.randn(num_blocks, block_size, hkv, d)  # [N, bs, Hkv, D]
    for _ in range(3):
        seq = rng.randint(2, 80)
        t = rng.randint(1, min(seq, 9))
        table = torch.tensor(rng.sample(range(num_blocks - 200, num_blocks), -(-seq // block_size)))  # [B]
        q = torch.randn(t, hq, d)  # [T, Hq, D]
        ref = A.paged_attention(q, k_cache, v_cache, table, seq - t, kind, window)  # [T, Hq, D]
        got = A.launch_paged_attention_kernel(kernel, q, k_cache, v_cache, table, seq - t, kind, window)  # [T, Hq, D]
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_interpreted_kernel_reads_the_block_table():
    """Teeth: a table pointing one block off gives different numbers."""
    kernel = A._build_kernel()
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(64, 4, 2, 16), torch.randn(64, 4, 2, 16)
    table = torch.tensor([5, 9, 2, 30])
    q = torch.randn(3, 4, 16)
    ref = A.paged_attention(q, k_cache, v_cache, table, 12, "full")
    wrong = A.launch_paged_attention_kernel(kernel, q, k_cache, v_cache, table + 1, 12, "full")
    assert not torch.allclose(wrong, ref, rtol=1e-5, atol=1e-5)
