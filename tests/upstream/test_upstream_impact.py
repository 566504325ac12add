"""The numeric impact in docs/upstream/ is what the buggy block tables give and the fixed ones remove
(kvspec's torch oracle machinery, no vLLM needed)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from upstream_impact import Impact, chunk_not_multiple, full_load_chunked, full_load_sliding, invalid_block


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
    assert chunk_not_multiple().attn_rel > 0.5
