"""vLLM bug: recovering from invalid KV blocks (``kv_load_failure_policy="recompute"``) under a sliding
window recomputes from a position whose window the admission already nulled
(docs/upstream/invalid-block-recovery-window.md).

Flow (the real ``Scheduler`` on CPU, one sliding-window group as vLLM requires for block-level
failures): a request of ``T`` tokens loads all of them asynchronously; admission pads the table with
``z = (T - W + 1) // B`` nulls and allocates blocks for the rest; the load completes with block ``i``
reported invalid; ``_update_requests_with_invalid_blocks`` cuts ``num_computed_tokens`` to ``i * B``
and the next step recomputes from there -- the query at ``i * B`` reads ``[i*B - W + 1, i*B]``,
inside the null prefix exactly when

    z >= 1 and (i - z) * B < W - 1

(derived and proven for all sizes by ``kvspec prove window_coverage.invalid_block_recovery``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("einops", reason="vLLM's ModelConfig imports einops to inspect the model architecture")

from upstream_vllm import (  # noqa: E402
    BLOCK,
    computed_step,
    finish_loads,
    known_affected,
    null_reads,
    request,
    scheduler,
    sliding_window,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowSpec  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

W, T = 128, 200  # gpt-oss window; a 200-token prompt: 4 null blocks, real blocks 4..12


class NullBlockRead(AssertionError):
    """The recompute after an invalid block reads positions through the null block."""


def condition(i: int) -> bool:
    z = (T - W + 1) // BLOCK
    return z >= 1 and (i - z) * BLOCK < W - 1


def recompute_reads(i: int) -> tuple[str, list[tuple[int, int]]]:
    """Load T tokens, report loaded block ``i`` invalid; (outcome, null reads of the recompute step)."""
    sched = scheduler(sliding_window(W))
    sched.add_request(request("r", T, load=T))
    out = sched.schedule()
    table = sched.kv_cache_manager.get_block_ids("r")[0]
    finish_loads(sched, out, "r", invalid={table[i]})
    out = sched.schedule()
    req = sched.requests["r"]
    if "r" not in out.num_scheduled_tokens:
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS, "freed and loading afresh"
        return "reloading", []
    start, _, tables = computed_step(sched, out, "r")
    assert start == i * BLOCK, "recovery recomputes from the first invalid block"
    return "recomputing", null_reads(sched, start, tables)


def loaded_blocks() -> range:
    return range((T - W + 1) // BLOCK, -(-T // BLOCK))


@pytest.mark.xfail(
    known_affected("invalid-block-recovery-window"),
    strict=True,
    raises=NullBlockRead,
    reason="vLLM 0.23.0-0.34.0 recompute from a position whose window blocks are null",
)
def test_invalid_block_recovery_reads_no_null_block() -> None:
    bad = {i: reads for i in loaded_blocks() if (reads := recompute_reads(i)[1])}
    if not bad:
        return  # fixed
    assert sorted(bad) == [i for i in loaded_blocks() if condition(i)], "the bug moved: update the condition"
    raise NullBlockRead(
        f"T={T}, W={W}: after invalid block {min(bad)} the recompute reads "
        f"{bad[min(bad)][:3]}... through the null block; affected blocks {sorted(bad)}"
    )


_original = Scheduler._update_requests_with_invalid_blocks


def _recompute_from_scratch_if_window_lost(
    self: Scheduler,
    requests: Any,
    invalid_block_ids: set[int],
    num_scheduled_tokens: dict[str, int],
    evict_blocks: bool = True,
) -> tuple[set[str], int, set[int]]:
    """Proposed fix: when the window of the first token to recompute was already dropped, recompute
    from scratch (``num_computed_tokens = 0``; vLLM then frees an async load's blocks and looks the
    request up again).  A sync (running) request would also have to be preempted."""
    requests = list(requests)
    affected, tokens, evict = _original(self, requests, invalid_block_ids, num_scheduled_tokens, evict_blocks)
    null = self.kv_cache_manager.block_pool.null_block.block_id
    for req in requests:
        if req.request_id not in affected or req.num_computed_tokens == 0:
            continue
        (table,) = self.kv_cache_manager.get_block_ids(req.request_id)
        (group,) = self.kv_cache_config.kv_cache_groups
        spec = group.kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            first = max(0, req.num_computed_tokens - spec.sliding_window + 1)
            if table[first // self.block_size] == null:
                req.num_computed_tokens = 0
    return affected, tokens, evict


def test_fix_recompute_from_scratch_removes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Scheduler, "_update_requests_with_invalid_blocks", _recompute_from_scratch_if_window_lost)
    outcomes = {i: recompute_reads(i) for i in loaded_blocks()}
    assert all(reads == [] for _, reads in outcomes.values())
    assert {i for i, (what, _) in outcomes.items() if what == "reloading"} == {
        i for i in loaded_blocks() if condition(i)
    }
