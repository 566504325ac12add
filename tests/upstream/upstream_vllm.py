"""vLLM's real ``Scheduler`` on CPU with a stub KV connector: the shared setup of the upstream
reproductions in this folder.  Only vLLM's own classes are used (nothing from kvspec), so each test
file plus this module can be handed to vLLM as is.

- The model is a tiny Llama ``config.json`` written at run time (no weights; ``ModelConfig`` only
  inspects the architecture, which imports ``einops``).  ``DeviceConfig(device="cpu")``.
- The KV-cache groups are given directly (``KVCacheConfig``), so any mix of full, sliding-window and
  chunked-local groups can be tried on one config.
- ``WholePromptConnector`` is the scheduler side of a P/D consumer written against vLLM's connector
  base API: a request whose ``kv_transfer_params`` carry ``{"load": n}`` gets its tokens up to ``n``
  loaded (asynchronously by default, as NIXL does for ``do_remote_prefill``); the test completes the
  load by returning the request in ``KVConnectorOutput.finished_recving``.
- What a query reads (vLLM's attention kernels): the query at position ``p`` of a sliding-window
  layer reads ``[p - W + 1, p]`` (FlashAttention ``window_size = (W - 1, 0)``); of a chunked-local
  layer ``[p // C * C, p]``.
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch
import vllm
from packaging.version import Version
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
NUM_BLOCKS = 2048
MAX_MODEL_LEN = 16384
VLLM_VERSION = Version(vllm.__version__)
RELEASES_RUN = (
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
"""The released wheels these reproductions were run on, each in its own environment (the same list
as kvspec's ``spec/releases/line.py``, repeated because this helper travels with the reports and
imports nothing of kvspec; the tables in
docs/upstream/*.md give the result per release and bug)."""
LAST_AFFECTED = {
    "full-remote-load-window": Version("0.34.0"),
    "invalid-block-recovery-window": Version("0.34.0"),
    "chunked-local-chunk-not-block-multiple": Version("0.34.0"),
    "push-receive-never-ends": Version("0.34.0"),
    "recompute-keeps-failed-blocks-cached": Version("0.34.0"),
}
"""Per bug, the newest release on which its reproduction was run and found it (every release of
``RELEASES_RUN`` showed all three).  A later version runs the reproductions as plain tests, so a fix
shows as XPASS (strict: a failure to act on) and a still-broken newer version fails loudly until the
bound is moved."""


def known_affected(bug: str) -> bool:
    """Whether the installed vLLM is a release known to have ``bug`` (a report of docs/upstream/, by its file name)."""
    return VLLM_VERSION <= LAST_AFFECTED[bug]


class WholePromptConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler side of a P/D consumer: loads ``kv_transfer_params["load"]`` tokens (async unless
    ``"sync": True``), like NIXL's ``do_remote_prefill`` which loads the whole prompt."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        count = max(0, int(params.get("load", 0)) - num_computed_tokens)
        return count, count > 0 and not params.get("sync", False)

    def update_state_after_alloc(self, request: Request, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


@cache
def vllm_config(attention_chunk_size: int | None = None) -> VllmConfig:
    """One tiny-Llama config per chunk size (``config.json`` written to a temporary folder)."""
    model_dir = Path(tempfile.mkdtemp(prefix="upstream-tiny-llama-"))
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": MAX_MODEL_LEN,
    }
    if attention_chunk_size is not None:
        hf["attention_chunk_size"] = attention_chunk_size
    (model_dir / "config.json").write_text(json.dumps(hf))
    model = ModelConfig(
        model=str(model_dir), dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN
    )
    cache = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True)
    cache.num_gpu_blocks = NUM_BLOCKS
    sched = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    transfer = KVTransferConfig(
        kv_connector="WholePromptConnector",
        kv_role="kv_consumer",
        kv_connector_module_path=__name__,
        kv_load_failure_policy="recompute",
    )
    init_none_hash(sha256)
    return VllmConfig(
        model_config=model,
        cache_config=cache,
        scheduler_config=sched,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=transfer,
    )


def full() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)


def sliding_window(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32, sliding_window=window)


def chunked_local(chunk: int) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32, attention_chunk_size=chunk
    )


def scheduler(*specs: KVCacheSpec, config: VllmConfig | None = None, num_blocks: int = NUM_BLOCKS) -> Scheduler:
    """The real Scheduler (and KVCacheManager) with one KV-cache group per spec, sharing ``num_blocks``
    blocks (the null block included)."""
    groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return create_scheduler(config or vllm_config(), num_blocks=num_blocks, kv_cache_config=kv)


def create_scheduler(config: VllmConfig, num_blocks: int, kv_cache_config: KVCacheConfig) -> Scheduler:
    """vLLM's ``Scheduler`` over ``kv_cache_config``, named and called like the helper of vLLM's
    ``tests/v1/kv_connector/unit/utils.py``, so that a test written with it reads as one of vLLM's."""
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(config),
        block_size=config.cache_config.block_size,
    )


def request(rid: str, num_tokens: int, load: int | None = None, sync: bool = False) -> Request:
    req = Request(
        request_id=rid,
        prompt_token_ids=list(range(1, num_tokens + 1)),
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )
    if load is not None:
        req.kv_transfer_params = {"load": load, "sync": sync}
    return req


def model_runner_output(
    req_ids: list[str], sampled: list[list[int]], kv: KVConnectorOutput | None = None
) -> ModelRunnerOutput:
    """One step's ``ModelRunnerOutput``: ``sampled[i]`` for ``req_ids[i]``, and the connector's report."""
    # vLLM up to 0.33 also wants req_id_to_index; 0.34 dropped the field.
    rows = {}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:
        rows = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, kv_connector_output=kv, **rows)


def finish_loads(sched: Scheduler, out: SchedulerOutput, *rids: str, invalid: set[int] | None = None) -> None:
    """The worker's report for ``out``: the loads of ``rids`` are done (some blocks invalid)."""
    kv = KVConnectorOutput(finished_recving=set(rids), invalid_block_ids=invalid or set())
    sched.update_from_output(out, model_runner_output([], [], kv))


def computed_step(sched: Scheduler, out: SchedulerOutput, rid: str) -> tuple[int, int, tuple[list[int], ...]]:
    """(first position computed, tokens scheduled, block table per group) of ``rid`` in ``out``, as the
    worker receives them (a request resuming from a load is sent as a new request)."""
    new = [r for r in out.scheduled_new_reqs if r.req_id == rid]
    assert new, f"{rid} is not (re)started in this step: {out.num_scheduled_tokens}"
    return new[0].num_computed_tokens, out.num_scheduled_tokens[rid], new[0].block_ids


def null_reads(sched: Scheduler, start: int, tables: tuple[list[int], ...]) -> list[tuple[int, int]]:
    """(group, position) of every position the query at ``start`` reads through the null block."""
    null = sched.kv_cache_manager.block_pool.null_block.block_id
    out = []
    for gid, table in enumerate(tables):
        spec = sched.kv_cache_config.kv_cache_groups[gid].kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            first = max(0, start - spec.sliding_window + 1)
        elif isinstance(spec, ChunkedLocalAttentionSpec):
            first = start // spec.attention_chunk_size * spec.attention_chunk_size
        else:
            first = 0
        out += [(gid, q) for q in range(first, start + 1) if table[q // BLOCK] == null]
    return out
