"""A missing start-up validation in vLLM: chunked local attention with ``attention_chunk_size %
block_size != 0`` is accepted by every configuration step and only stopped by an assertion in the
attention metadata builder at the first forward pass (docs/upstream/chunked-local-chunk-not-block-multiple.md,
a proposed validation, not a wrong-output bug).

What the check would also protect: the KV-cache manager counts every block before the block holding
the chunk start as a hit (null blocks), although the next query's chunk starts inside the last of
them; a fresh request then skips computing those tokens and its first query reads them through the
null block.  Condition (fresh request of ``T`` tokens, nothing cached; general form proven by
``kvspec prove window_coverage.chunk_not_block_multiple``): with ``h = (T - 1) // C * C // B * B``,

    h % C != 0

Every release 0.23.0 ... 0.34.0 accepts the configuration (``ModelConfig``, ``CacheConfig``, the
KV-cache manager and the ``Scheduler`` all construct and schedule) and asserts
``attn_chunk_size % block_size == 0`` in ``make_local_attention_virtual_batches``: a start-up error
deferred to the first batch.
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
    known_affected,
    null_reads,
    request,
    scheduler,
    vllm_config,
)
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager  # noqa: E402
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec  # noqa: E402

C = 40  # not a multiple of BLOCK = 16
LENGTHS = range(1, 3 * C + 1)


class ChunkReadsNull(AssertionError):
    """A query's chunk reaches into blocks the lookup counted as hit (null blocks)."""


def condition(T: int) -> bool:
    h = (T - 1) // C * C // BLOCK * BLOCK
    return h % C != 0


def null_reading_lengths() -> dict[int, list[tuple[int, int]]] | None:
    """Per prompt length, what the first step reads through the null block; None if vLLM refuses the
    configuration."""
    config = vllm_config(attention_chunk_size=C)
    bad = {}
    for T in LENGTHS:  # a fresh scheduler each time: nothing cached
        try:
            sched = scheduler(chunked_local(C), config=config)
        except ValueError:
            return None
        sched.add_request(request("r", T))
        start, _, tables = computed_step(sched, sched.schedule(), "r")
        if reads := null_reads(sched, start, tables):
            bad[T] = reads
    return bad


@pytest.mark.xfail(
    known_affected("K3"),
    strict=True,
    raises=ChunkReadsNull,
    reason="K3: vLLM 0.23.0-0.34.0 accept a chunk size that is not a block multiple",
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
    scheduler(chunked_local(2 * BLOCK), config=vllm_config(attention_chunk_size=2 * BLOCK))  # multiples still run
