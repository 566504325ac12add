"""The installed vLLM's real ``Scheduler`` (0.33.0, 0.34.0) on CPU, offline, from a kvspec ``KVCacheConfig``.

The model is a tiny Llama ``config.json`` written at run time into a temporary folder (no weights:
``ModelConfig`` only inspects the architecture), ``DeviceConfig(device="cpu")``, and the KV-cache
groups are given directly as vLLM's ``KVCacheConfig`` (one dummy layer per kvspec group, built by
``harness.targets.vllm``).  The scheduler knobs (``SchedKnobs``): token budget, ``max_num_seqs``, a
KV connector (``StubConnector``, a P/D consumer that loads what ``kv_transfer_params["load"]`` says)
and ngram speculative decoding.  ``build_scheduler`` returns the scheduler and the kvspec config that
matches the manager it built (``max_in_flight_tokens`` is the scheduler's own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.vllm_release import fields_of
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount

CONNECTOR_NAME = "StubConnector"


@dataclass(frozen=True)
class SchedKnobs:
    """The real scheduler's knobs a run varies."""

    token_budget: int = 64  # max_num_batched_tokens (chunked prefill on)
    max_num_seqs: int = 4
    num_spec_tokens: int = 0  # ngram speculative decoding when > 0
    connector: bool = False  # the stub KV connector (P/D consumer)
    load_failure_policy: Literal["recompute", "fail"] = (
        "recompute"  # the connector's kv_load_failure_policy: recompute | fail
    )


def supported(config: KVCacheConfig) -> str | None:
    """Why the real scheduler cannot run ``config`` on CPU here (None: it can)."""
    if config.profile.release is None:
        return f"the real scheduler runs the installed release, not the what-if profile {config.profile.name!r}"
    kinds = {g.kind for g in config.groups}
    if "cross" in kinds:
        return "cross attention needs an encoder-decoder model (not built on CPU here)"
    if config.hash_block_size_override is not None:
        return "a hash block size smaller than the groups' is not a scheduler knob"
    if config.hash_algo != "sha256":
        return f"hash algo {config.hash_algo!r} is set by the engine's prefix_caching_hash_algo, not built here"
    if config.watermark:
        return "the watermark is not a scheduler knob here"
    return None


def _stub_connector_module() -> str:
    """The module vLLM imports the stub connector from (``harness.vllm_sched.connector``)."""
    return "kvspec.harness.vllm_sched.connector"


@cache
def tiny_model_dir(max_model_len: int) -> str:
    """A folder holding only a tiny Llama ``config.json`` (written once per length and process)."""
    model_dir = Path(tempfile.mkdtemp(prefix="kvspec-tiny-llama-"))
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": max(max_model_len, 64),
    }
    (model_dir / "config.json").write_text(json.dumps(hf))
    return str(model_dir)


def build_vllm_config(config: KVCacheConfig, knobs: SchedKnobs) -> Any:
    """vLLM's ``VllmConfig`` for ``config`` and ``knobs`` (CPU device, tiny model, no weights)."""
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig

    mml = int(config.max_model_len)
    model = ModelConfig(model=tiny_model_dir(mml), dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=mml)
    cache_cfg = CacheConfig(
        block_size=int(config.scheduler_block_size),
        cache_dtype="auto",
        enable_prefix_caching=config.enable_caching,
    )
    cache_cfg.num_gpu_blocks = int(config.num_blocks)
    sched = SchedulerConfig(
        max_num_seqs=knobs.max_num_seqs,
        max_num_batched_tokens=knobs.token_budget,
        max_model_len=mml,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=False,  # vLLM's synchronous Scheduler: one batch in flight
    )
    extra: dict[str, Any] = {}
    if knobs.connector:
        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_role="kv_consumer",
            kv_connector_module_path=_stub_connector_module(),
            kv_load_failure_policy=knobs.load_failure_policy,
        )
    if knobs.num_spec_tokens:
        from vllm.config import ParallelConfig, SpeculativeConfig

        extra["speculative_config"] = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=knobs.num_spec_tokens,
            prompt_lookup_min=1,
            prompt_lookup_max=2,
            target_model_config=model,
            target_parallel_config=ParallelConfig(),
        )
    return VllmConfig(
        model_config=model,
        cache_config=cache_cfg,
        scheduler_config=sched,
        device_config=DeviceConfig(device="cpu"),
        **extra,
    )


def build_scheduler(config: KVCacheConfig, knobs: SchedKnobs) -> tuple[Any, KVCacheConfig]:
    """(vLLM's real ``Scheduler``, the kvspec config of its ``KVCacheManager`` under the installed
    release's profile).  Raises ``Unsupported`` (with the reason) for a config it cannot run here."""
    why = supported(config)
    if why:
        raise Unsupported(why)
    from kvspec.harness.targets.vllm import _make_vllm_kv_cache_config, _vllm

    v = _vllm()
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    logging.getLogger("vllm").setLevel(logging.ERROR)
    # A failed KV load under the "fail" policy is logged as an error by the scheduler: the driver
    # makes them on purpose (harness.vllm_sched.driver), so they are not worth a line each.
    logging.getLogger("vllm.v1.core.sched.scheduler").setLevel(logging.CRITICAL)
    try:
        vc = build_vllm_config(config, knobs)
    except Exception as e:  # noqa: BLE001 - vLLM's config validation: a clear reason, not a crash
        raise Unsupported(f"vLLM refused the scheduler config: {type(e).__name__}: {e}") from None
    init_none_hash(sha256)
    sched = Scheduler(
        vllm_config=vc,
        kv_cache_config=_make_vllm_kv_cache_config(v, config),
        structured_output_manager=StructuredOutputManager(vc),
        block_size=int(config.scheduler_block_size),
        hash_block_size=int(config.hash_block_size),
        log_stats=False,
    )
    mift = TokenCount(int(vc.max_in_flight_tokens))
    # The spec mirrors the installed release: its profile (``harness.targets.vllm_release``).
    spec_config = dataclasses.replace(config, max_in_flight_tokens=mift, profile=v.api.profile).validate()
    return sched, spec_config


def block_hasher(config: KVCacheConfig) -> Any:
    """The block hasher vLLM's engine gives each request (None without prefix caching or connector)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    return get_request_block_hasher(int(config.hash_block_size), sha256)


def model_runner_output(cls: Any, req_ids: list[str], sampled: list[list[int]], kv_out: Any) -> Any:
    """vLLM's ``ModelRunnerOutput`` for one step: up to 0.33 it also carries ``req_id_to_index``
    (each request's row in ``sampled_token_ids``), which 0.34 derives from ``req_ids`` itself."""
    extra = {}
    if "req_id_to_index" in fields_of(cls):
        extra["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    return cls(req_ids=req_ids, sampled_token_ids=sampled, kv_connector_output=kv_out, **extra)


if __name__ == "__main__":  # a cold start's start-up (harness.run.startup): build one scheduler, then exit
    build_scheduler(KVCacheConfig(BlockCount(64), (full_attention(16),), TokenCount(256)), SchedKnobs())
