"""The records kvspec's allocator reads: the request (vLLM 0.33 ``vllm.v1.request.Request``) and
one KV-cache group's spec (vLLM 0.33 ``kv_cache_interface``)."""

from __future__ import annotations

from dataclasses import dataclass, field

# vLLM 0.33 ``RequestStatus`` values the manager distinguishes.
WAITING, RUNNING, PREEMPTED, WAITING_FOR_REMOTE_KVS = "WAITING", "RUNNING", "PREEMPTED", "WAITING_FOR_REMOTE_KVS"


@dataclass(slots=True)
class Request:
    """The fields of vLLM 0.33 ``Request`` that the manager reads."""

    request_id: str
    all_token_ids: list[int]
    num_prompt_tokens: int
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: str = WAITING
    skip_reading_prefix_cache: bool = False
    # Async scheduling (vLLM 0.33 ``Request.num_in_flight_tokens``): tokens counted as computed
    # whose step has not returned yet; the window is measured without them (vLLM 0.26 and later).
    num_in_flight_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """One KV-cache group: ``kind`` in full / sliding_window / chunked_local / cross."""

    kind: str
    block_size: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def prefix_cacheable(self) -> bool:
        return self.kind != "cross"

    @property
    def window(self) -> int:
        """``sliding_window``, which a sliding-window group must set."""
        if self.sliding_window is None:
            raise ValueError(f"a {self.kind} group needs sliding_window")
        return self.sliding_window

    @property
    def chunk_size(self) -> int:
        """``attention_chunk_size``, which a chunked-local group must set."""
        if self.attention_chunk_size is None:
            raise ValueError(f"a {self.kind} group needs attention_chunk_size")
        return self.attention_chunk_size
