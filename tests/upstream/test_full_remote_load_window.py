"""vLLM bug: after a KV load of the whole prompt (P/D), recomputing the last prompt token reads the null
block in sliding-window and chunked-local layers (docs/upstream/full-remote-load-window.md).

Flow (the real ``Scheduler`` on CPU): a request of ``P`` tokens arrives; the connector reports all
``P`` tokens as external, loaded asynchronously; admission (``allocate_slots`` ->
``add_local_computed_blocks``) pads the table with ``skipped(P) // B`` null blocks; the load
completes; ``_update_waiting_for_remote_kv`` sets ``num_computed_tokens = P - 1`` and the next step
computes token ``P - 1``, whose window starts at ``P - W`` (sliding window) or ``P - C`` (chunked,
``P % C == 0``) -- inside the null prefix exactly when

    sliding window W:  (P - W + 1) % B == 0 and P - W + 1 >= B
    chunked local C:   P % C == 0 (for C % B == 0)

(derived and proven for all sizes by ``kvspec prove window_coverage.full_remote_load``).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("einops", reason="vLLM's ModelConfig imports einops to inspect the model architecture")

from upstream_vllm import (  # noqa: E402
    BLOCK,
    chunked_local,
    computed_step,
    finish_loads,
    full,
    known_affected,
    null_reads,
    request,
    scheduler,
    sliding_window,
)
from vllm.v1.core.single_type_kv_cache_manager import (  # noqa: E402
    ChunkedLocalAttentionManager,
    SlidingWindowManager,
)
from vllm.v1.request import RequestStatus  # noqa: E402


class NullBlockRead(AssertionError):
    """The step recomputing token P - 1 reads positions through the null block."""


def condition(kind: str, P: int, span: int) -> bool:
    if kind == "sliding_window":
        return (P - span + 1) % BLOCK == 0 and P - span + 1 >= BLOCK
    return P % span == 0  # chunked local, span % BLOCK == 0


def bad_lengths(
    kind: str, span: int, lengths: Iterable[int], hybrid: bool = False, backoff: int = 0
) -> dict[int, list[tuple[int, int]]]:
    """For each prompt length: the (group, position) the recompute of token P - 1 reads as null.  With
    ``backoff`` the connector loads ``P - backoff`` tokens (NIXL's and Mooncake's prefill backoff)."""
    window = sliding_window(span) if kind == "sliding_window" else chunked_local(span)
    bad = {}
    for P in lengths:
        sched = scheduler(*((full(), window) if hybrid else (window,)))
        sched.add_request(request("r", P, load=P - backoff))
        out = sched.schedule()
        assert sched.requests["r"].status == RequestStatus.WAITING_FOR_REMOTE_KVS and not out.num_scheduled_tokens
        finish_loads(sched, out, "r")
        start, scheduled, tables = computed_step(sched, sched.schedule(), "r")
        assert (start, scheduled) == (P - 1, 1), "the step after the load recomputes token P - 1 only"
        if reads := null_reads(sched, start, tables):
            bad[P] = reads
    return bad


CASES = [  # kind, W or C, prompt lengths, hybrid (full + window groups, gpt-oss / Llama 4 style)
    ("sliding_window", 128, range(128, 128 + 2 * BLOCK + 1), False),  # gpt-oss W, P = 143 and 159 hit
    ("sliding_window", 128, [143, 144], True),
    ("sliding_window", 4096, [4110, 4111, 4112], False),  # Mistral-7B-v0.1 / Gemma 2 W
    ("chunked_local", 8192, [8191, 8192, 8193], True),  # Llama 4 C
]


@pytest.mark.xfail(
    known_affected("full-remote-load-window"),
    strict=True,
    raises=NullBlockRead,
    reason="vLLM 0.23.0-0.34.0 null the window of the recomputed last prompt token",
)
@pytest.mark.parametrize("kind, span, lengths, hybrid", CASES, ids=lambda c: str(c))
def test_full_remote_load_recompute_reads_no_null_block(
    kind: str, span: int, lengths: Iterable[int], hybrid: bool
) -> None:
    lengths = list(lengths)
    bad = bad_lengths(kind, span, lengths, hybrid)
    if not bad:
        return  # fixed
    assert sorted(bad) == [P for P in lengths if condition(kind, P, span)], "the bug moved: update the condition"
    P = min(bad)
    raise NullBlockRead(
        f"P={P}: recomputing token {P - 1} reads (group, position) {bad[P][:3]}... "
        f"through the null block; affected lengths {sorted(bad)}"
    )


def _retain_one_more_sliding(self: SlidingWindowManager, num_computed_tokens: int) -> int:
    """Proposed fix: keep one extra trailing token below the window (as ``extra_retained_tokens >= 1``
    would), so a load of P tokens keeps the window of token P - 1.  (Releases before 0.28 have no
    ``extra_retained_tokens``: 0 there.)"""
    extra = max(getattr(self, "extra_retained_tokens", 0), 1)
    return max(0, num_computed_tokens - self.sliding_window + 1 - extra)


def _retain_one_more_chunked(self: ChunkedLocalAttentionManager, num_computed_tokens: int) -> int:
    """The chunked-local counterpart: skip the chunks before token ``num_computed_tokens - 1``."""
    return max(0, num_computed_tokens - 1) // self.attention_chunk_size * self.attention_chunk_size


@pytest.mark.parametrize("kind, span, lengths, hybrid", CASES, ids=lambda c: str(c))
def test_fix_retaining_one_more_token_removes_it(
    monkeypatch: pytest.MonkeyPatch, kind: str, span: int, lengths: Iterable[int], hybrid: bool
) -> None:
    monkeypatch.setattr(SlidingWindowManager, "get_num_skipped_tokens", _retain_one_more_sliding)
    monkeypatch.setattr(ChunkedLocalAttentionManager, "get_num_skipped_tokens", _retain_one_more_chunked)
    assert bad_lengths(kind, span, lengths, hybrid) == {}
    # the window still releases memory: 4 of the 13 blocks of a 200-token load stay null
    sched = scheduler(sliding_window(128))
    sched.add_request(request("r", 200, load=200))
    sched.schedule()
    assert sched.kv_cache_manager.get_block_ids("r")[0][:5] == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("kind, span, lengths, hybrid", CASES, ids=lambda c: str(c))
def test_fix_prefill_backoff_for_window_groups_removes_it(
    kind: str, span: int, lengths: Iterable[int], hybrid: bool
) -> None:
    """The guard vLLM applies to DeepSeek-V4.1's bounded-replay window since 0.32 (NIXL's
    ``_prefill_backoff()`` = 1, Mooncake's ``_get_remote_prefill_token_count``: load ``P - 1`` tokens,
    the decoder computes token ``P - 1`` itself), applied to these window groups: the same step, token
    ``P - 1`` alone, now reads no null block."""
    assert bad_lengths(kind, span, lengths, hybrid, backoff=1) == {}
