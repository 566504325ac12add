"""A missing start-up validation in vLLM: chunked local attention with ``attention_chunk_size %
block_size != 0`` is accepted by every configuration step and only stopped by an assertion in the
attention metadata builder at the first forward pass, where the kernel's block is the configured one
(docs/upstream/chunked-local-chunk-not-block-multiple.md; a proposed validation).

What the check would also protect: the chunked-local manager counts every block before the one that
holds the chunk start as a hit (null blocks), although the chunk starts inside the next block.  A step
that starts at that block boundary reads the uncomputed tokens before the chunk start through the null
block.  It is reached

- in a model whose every attention layer is chunked-local, by a fresh prompt of ``T`` tokens when
  ``h % C != 0`` with ``h = (T - 1) // C * C // B * B``;
- in a model with full-attention layers too (Llama 4), only by a prefix hit whose chunked-local block
  holding the chunk start was evicted while the full-attention blocks of the prefix were not: the
  hybrid lookup trims the hit to what every group can serve, so a fresh prompt gets no hit at all.

Measured on every release 0.23.0 ... 0.34.0.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("einops", reason="vLLM's ModelConfig imports einops to inspect the model architecture")

import torch  # noqa: E402
import vllm.v1.attention.backends.utils as backend_utils  # noqa: E402
from upstream_vllm import (  # noqa: E402
    BLOCK,
    chunked_local,
    computed_step,
    full,
    known_affected,
    model_runner_output,
    null_reads,
    request,
    scheduler,
    vllm_config,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager  # noqa: E402
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, KVCacheSpec  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

C = 40  # not a multiple of BLOCK = 16
LENGTHS = range(1, 3 * C + 1)


class ChunkReadsNull(AssertionError):
    """A query's chunk reaches into blocks the lookup counted as hit (null blocks)."""


def condition(T: int) -> bool:
    h = (T - 1) // C * C // BLOCK * BLOCK
    return h % C != 0


def null_reading_lengths(*specs: KVCacheSpec) -> dict[int, list[tuple[int, int]]] | None:
    """Per prompt length, what the first step of a fresh prompt reads through the null block (one
    KV-cache group per spec; chunked-local only by default); None if vLLM refuses the configuration."""
    config = vllm_config(attention_chunk_size=C)
    bad = {}
    for T in LENGTHS:  # a fresh scheduler each time: nothing cached
        try:
            sched = scheduler(*(specs or (chunked_local(C),)), config=config)
        except ValueError:
            return None
        sched.add_request(request("r", T))
        start, _, tables = computed_step(sched, sched.schedule(), "r")
        if reads := null_reads(sched, start, tables):
            bad[T] = reads
    return bad


@pytest.mark.xfail(
    known_affected("chunked-local-chunk-not-block-multiple"),
    strict=True,
    raises=ChunkReadsNull,
    reason="vLLM 0.23.0-0.34.0 accept a chunk size that is not a block multiple",
)
def test_chunk_not_block_multiple_is_rejected_or_reads_no_null() -> None:
    bad = null_reading_lengths()
    if not bad:
        return  # rejected at startup, or fixed in the manager
    assert sorted(bad) == [T for T in LENGTHS if condition(T)], "the bug moved: update the condition"
    T = min(bad)
    raise ChunkReadsNull(
        f"C={C}, B={BLOCK}, T={T}: the first step starts at {(T - 1) // C * C // BLOCK * BLOCK} and "
        f"reads {bad[T][:3]}... through the null block; affected lengths: {len(bad)} of {len(LENGTHS)}"
    )


def _request(rid: str, tokens: list[int], max_tokens: int) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def _step(sched: Scheduler) -> SchedulerOutput:
    """One scheduler step; every scheduled request samples one token."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, model_runner_output(ids, [[7]] * len(ids)))
    return out


def hybrid_prefix_hit(num_blocks: int) -> tuple[int, list[tuple[int, int]]] | None:
    """Full + chunked-local groups (as in Llama 4) sharing ``num_blocks`` blocks: request A (100
    tokens) runs to completion; request F (64 other tokens) takes free blocks; request B shares A's
    first 60 tokens (a 48-token hit in the full group, past the chunk start 40).  B's first step:
    (start, what it reads through the null block); None if vLLM refuses the configuration."""
    try:
        sched = scheduler(full(), chunked_local(C), config=vllm_config(attention_chunk_size=C), num_blocks=num_blocks)
    except ValueError:
        return None
    a = list(range(1, 101))
    sched.add_request(_request("A", a, max_tokens=3))
    for _ in range(3):  # the prefill, then decodes: A's chunked-local blocks before 80 are freed first
        _step(sched)
    assert "A" not in sched.requests
    sched.add_request(_request("F", list(range(5000, 5064)), max_tokens=100))
    _step(sched)
    sched.add_request(_request("B", a[:60] + list(range(9000, 9010)), max_tokens=4))
    start, _, tables = computed_step(sched, _step(sched), "B")  # F's decode evicts A's block 2 first
    return start, null_reads(sched, start, tables)


def test_hybrid_fresh_prompt_or_no_eviction_reads_no_null() -> None:
    """With a full-attention group, a fresh prompt gets no hit (the hybrid lookup keeps only what every
    group serves), and a prefix hit whose blocks are all cached starts at the full hit."""
    assert null_reading_lengths(full(), chunked_local(C)) in ({}, None)
    assert hybrid_prefix_hit(num_blocks=64) in ((48, []), None)


@pytest.mark.xfail(
    known_affected("chunked-local-chunk-not-block-multiple"),
    strict=True,
    raises=ChunkReadsNull,
    reason="vLLM 0.23.0-0.34.0 accept a chunk size that is not a block multiple",
)
def test_hybrid_prefix_hit_after_eviction_reads_no_null() -> None:
    got = hybrid_prefix_hit(num_blocks=20)
    if got is None or not got[1]:
        return  # rejected at startup, or fixed in the manager
    start, reads = got
    raise ChunkReadsNull(
        f"C={C}, B={BLOCK}, full + chunked-local: after the chunked-local block holding the chunk start "
        f"was evicted, B's first step starts at {start} and reads {reads[:3]}... ({len(reads)} positions) "
        "through the null block"
    )


def _metadata(query_len: int, seq_len: int) -> CommonAttentionMetadata:
    loc = torch.tensor([0, query_len], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=loc,
        query_start_loc_cpu=loc,
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        num_reqs=1,
        num_actual_tokens=query_len,
        max_query_len=query_len,
        max_seq_len=seq_len,
        block_table_tensor=torch.arange(8, dtype=torch.int32)[None],
        slot_mapping=torch.arange(query_len),
    )


def test_what_keeps_it_from_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on CPU: no config validation rejects it; the first forward's metadata build asserts."""
    config = vllm_config(attention_chunk_size=C)
    assert config.model_config.attention_chunk_size == C and config.cache_config.block_size == BLOCK
    assert null_reading_lengths()  # the manager and the Scheduler run it
    # the host-to-device copy needs pinned memory (CUDA); a CPU stand-in lets the builder run here
    # (0.23.0 copies with torch's own .to() and has no async_tensor_h2d)
    if hasattr(backend_utils, "async_tensor_h2d"):
        monkeypatch.setattr(
            backend_utils,
            "async_tensor_h2d",
            lambda data, device=None, dtype=None, out=None: torch.as_tensor(data, dtype=dtype),
        )
    backend_utils.make_local_attention_virtual_batches(32, _metadata(9, 41), BLOCK)  # a block multiple: fine
    with pytest.raises(AssertionError, match="attn_chunk_size 40 is not divisible by block_size 16"):
        backend_utils.make_local_attention_virtual_batches(C, _metadata(9, 41), BLOCK)


def _check(spec: Any) -> None:
    """The proposed start-up validation: the chunk must be a whole number of blocks."""
    if spec.attention_chunk_size % spec.block_size:
        raise ValueError(
            f"attention_chunk_size {spec.attention_chunk_size} must be a multiple of the block size {spec.block_size}"
        )


_spec_init = ChunkedLocalAttentionSpec.__init__
_manager_init = ChunkedLocalAttentionManager.__init__


def _spec_init_validating(self: ChunkedLocalAttentionSpec, *args: Any, **kwargs: Any) -> None:
    """Where the chunked layer reports its KV-cache spec (``ChunkedLocalAttention.get_kv_cache_spec``,
    engine start-up): covers the hybrid manager off as well, where the builder would still assert."""
    _spec_init(self, *args, **kwargs)
    _check(self)


def _manager_init_validating(self: ChunkedLocalAttentionManager, kv_cache_spec: Any, **kwargs: Any) -> None:
    """Where the KV-cache manager is built (start-up, the block size final)."""
    _check(kv_cache_spec)
    _manager_init(self, kv_cache_spec, **kwargs)


@pytest.mark.parametrize("where", ["spec", "manager"])
def test_fix_rejecting_at_startup_removes_it(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    if where == "spec":
        monkeypatch.setattr(ChunkedLocalAttentionSpec, "__init__", _spec_init_validating)
    else:
        monkeypatch.setattr(ChunkedLocalAttentionManager, "__init__", _manager_init_validating)
    assert null_reading_lengths() is None
    assert hybrid_prefix_hit(num_blocks=20) is None
    scheduler(chunked_local(2 * BLOCK), config=vllm_config(attention_chunk_size=2 * BLOCK))  # multiples still run
