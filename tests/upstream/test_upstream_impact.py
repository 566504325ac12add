"""The numeric impact in docs/upstream/ is what the buggy block tables give and the fixed ones remove
(kvspec's torch oracle machinery, no vLLM needed)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from upstream_impact import (
    Impact,
    chunk_not_multiple,
    chunk_not_multiple_chunked_only,
    full_load_chunked,
    full_load_sliding,
    invalid_block,
)


@pytest.mark.parametrize(
    "measure",
    [full_load_sliding, full_load_chunked, invalid_block],
    ids=["full_load_sliding_W128_P143", "full_load_chunked_C64_P128", "invalid_block_W128_i5"],
)
def test_buggy_tables_change_the_numbers_and_the_fix_restores_them(measure: Callable[..., Impact]) -> None:
    bug, fixed = measure(), measure(fixed=True)
    assert bug.attn_rel > 1e-2 and bug.logits_rel > 1e-3, bug
    assert fixed.attn_rel < 1e-5 and fixed.logits_rel < 1e-5, fixed


def test_chunk_not_block_multiple_would_compute_wrong_numbers() -> None:
    """Llama-4-like, the prefix hit after the chunk-start block's eviction: the chunked layers' output
    and the sampled token's logits are wrong; the same hit with that block cached is exact."""
    bug, cached = chunk_not_multiple(), chunk_not_multiple(evicted=False)
    assert bug.attn_rel > 0.5 and bug.logits_rel > 1e-2, bug
    assert cached.attn_rel < 1e-5 and cached.logits_rel < 1e-5, cached


def test_chunk_not_block_multiple_chunked_only_keeps_the_sampled_token() -> None:
    """Every layer chunked-local: the queries before the chunk start read nulls, but nothing at or after
    the chunk start depends on them, so the sampled token's logits stay exact."""
    got = chunk_not_multiple_chunked_only()
    assert got.attn_rel > 0.5, got
    assert got.logits_rel < 1e-5, got
