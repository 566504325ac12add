"""vLLM 0.34.0's changes (spec/releases/v0_34.py), each on the spec under 0.34.0 and 0.33.0.

The expected outcomes were observed on real vLLM 0.34.0 and 0.33.0 (``VllmTarget`` in each release's
venv, the same operations): they are facts about the releases, not read off the spec.
"""

from __future__ import annotations

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount
from tests.spec.releases.vectors import outcomes

CONFIG = KVCacheConfig(BlockCount(8), (full_attention(4),), TokenCount(64))
PROMPT = tuple(range(1, 10))  # 9 tokens: two full blocks cached by the first request


def _hit_of_logprob_request(start: int | None, skip: bool) -> list[O.Op]:
    """r1 computes and caches 9 tokens; r2 (the same prompt, asking for prompt logprobs) looks up."""
    return [
        O.AddRequest("r1", PROMPT),
        O.GetComputedBlocks("r1"),
        O.AllocateSlots("r1", len(PROMPT)),
        O.AddRequest("r2", PROMPT, skip_reading_prefix_cache=skip, prompt_logprob_start=start),
        O.GetComputedBlocks("r2"),
    ]


# hit_limit_from_logprob_start: (prompt_logprob_start, skip) -> hit tokens on 0.33.0 and 0.34.0.
@pytest.mark.parametrize(
    ("start", "skip", "hit_033", "hit_034"),
    [
        (None, False, 8, 8),  # no prompt logprobs: both read the cache up to num_tokens - 1
        (None, True, 0, 0),  # prompt logprobs, default: both skip the cache
        (4, False, 8, 4),  # reads allowed, scored from row 4: 0.34 stops the hit there
        (5, False, 8, 4),  # ... a limit inside a block rounds the hit down to a block
        (0, False, 8, 0),  # scored from row 0: 0.34 reads nothing, 0.33 reads it all
    ],
)
def test_hit_limit_from_logprob_start(start: int | None, skip: bool, hit_033: int, hit_034: int) -> None:
    ops = _hit_of_logprob_request(start, skip)
    for release, hit in (("0.33.0", hit_033), ("0.34.0", hit_034)):
        lookup = outcomes(SpecTarget(), release, CONFIG, ops)[-1]
        assert lookup["num_hit_tokens"] == hit, (release, lookup)
        assert lookup["block_ids"] == [[1, 2][: hit // 4]], (release, lookup)
