"""The sliding-window case of vLLM's invalid-block recovery, written as a test of vLLM's own
``tests/v1/kv_connector/unit/test_invalid_blocks_correctness.py`` (a scheduler fixture, a
``Mock`` connector reporting an asynchronous load, the invalid block reported through the model
runner's output, assertions on what the next ``schedule()`` sends the worker).

It is the test attached to the follow-up in docs/upstream/invalid-block-recovery-window.md.  In
vLLM's tree the helpers imported from ``upstream_vllm`` are that folder's ``utils.py`` ones:
``create_vllm_config(kv_load_failure_policy="recompute")``, ``create_scheduler(vllm_config,
num_blocks=..., kv_cache_config=...)``, ``create_model_runner_output(reqs=[], ...)`` and
``create_mock_connector()`` for the ``Mock``; the rest runs unchanged.  It fails on every release from 0.23.0 to 0.34.0
(strict xfail here; a plain test from the first release that fixes it).
"""

from __future__ import annotations

from unittest.mock import Mock

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("einops", reason="vLLM's ModelConfig imports einops to inspect the model architecture")

import torch  # noqa: E402
from test_invalid_block_recovery_window import _recompute_from_scratch_if_window_lost  # noqa: E402
from upstream_vllm import create_scheduler, known_affected, model_runner_output  # noqa: E402
from upstream_vllm import vllm_config as create_vllm_config  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

BLOCK_SIZE = 16
SLIDING_WINDOW = 128


@pytest.fixture
def sliding_window_recompute_scheduler() -> Scheduler:
    """One sliding-window KV-cache group (block-level recovery needs a single group), policy
    'recompute'."""
    vllm_config = create_vllm_config()
    assert vllm_config.kv_transfer_config.kv_load_failure_policy == "recompute"
    spec = SlidingWindowSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=SLIDING_WINDOW
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=1000, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return create_scheduler(vllm_config, num_blocks=1000, kv_cache_config=kv_cache_config)


@pytest.mark.xfail(
    known_affected("invalid-block-recovery-window"),
    strict=True,
    raises=AssertionError,
    reason="vLLM 0.23.0-0.34.0 recompute from a position whose window blocks were nulled at admission",
)
def test_async_recompute_sliding_window_reads_no_null_block(sliding_window_recompute_scheduler: Scheduler) -> None:
    """A 200-token prompt loaded whole and asynchronously; its first loaded block is reported
    invalid.  The recompute must not start at a position whose window reaches the null blocks
    that admission put in front of the load (loading again from scratch is fine)."""
    recover_and_check(sliding_window_recompute_scheduler)


def test_fix_recompute_from_scratch_passes(
    sliding_window_recompute_scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test can pass: with the proposed fix applied at run time it does, on every release."""
    monkeypatch.setattr(Scheduler, "_update_requests_with_invalid_blocks", _recompute_from_scratch_if_window_lost)
    recover_and_check(sliding_window_recompute_scheduler)


def recover_and_check(scheduler: Scheduler) -> None:
    num_prompt_tokens = 200
    request = Request(
        request_id="0",
        prompt_token_ids=list(range(num_prompt_tokens)),
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )
    scheduler.add_request(request)

    scheduler.connector = Mock()  # vLLM's tree: create_mock_connector(); the whole prompt loads asynchronously
    scheduler.connector.get_num_new_matched_tokens.return_value = (num_prompt_tokens, True)
    scheduler.connector.request_finished.return_value = (False, None)
    scheduler.connector.take_events.return_value = ()
    scheduler.connector.get_loaded_kv_cache_group_ids.return_value = (0,)  # 0.34.0: asked at allocation

    scheduler_output = scheduler.schedule()
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    null_block_id = scheduler.kv_cache_manager.block_pool.null_block.block_id
    (req_block_ids,) = scheduler.kv_cache_manager.get_block_ids(request.request_id)
    first_loaded = next(i for i, b in enumerate(req_block_ids) if b != null_block_id)
    assert first_loaded == (num_prompt_tokens - SLIDING_WINDOW + 1) // BLOCK_SIZE  # 4 null blocks first

    # The load completes with its first loaded block invalid.
    kv_output = KVConnectorOutput(
        finished_recving={request.request_id}, invalid_block_ids={req_block_ids[first_loaded]}
    )
    scheduler.update_from_output(scheduler_output, model_runner_output([], [], kv_output))

    scheduler_output = scheduler.schedule()
    if not scheduler_output.scheduled_new_reqs:  # recovery chose to load the prompt again
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        return
    (new_req,) = scheduler_output.scheduled_new_reqs
    start = new_req.num_computed_tokens
    assert start == first_loaded * BLOCK_SIZE  # recovery recomputes from the invalid block
    window = range(max(0, start - SLIDING_WINDOW + 1), start + 1)
    read_through_null = [pos for pos in window if new_req.block_ids[0][pos // BLOCK_SIZE] == null_block_id]
    assert read_through_null == [], (
        f"the recomputed token at {start} reads positions {read_through_null[0]}..{read_through_null[-1]} "
        "through the null block"
    )
