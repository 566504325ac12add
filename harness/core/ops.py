"""The abstract operations the harness drives a target with.

A trace is a config followed by a list of these operations.  Each is either a call on the KV-cache
manager (vLLM 0.33 ``KVCacheManager`` method of the same meaning) or a change the scheduler makes to
a ``Request`` between calls (vLLM's scheduler owns the request object; the manager only reads it).
Every target applies exactly this vocabulary, so a trace replays on the spec, on vLLM, on ``impl``
or on a user's manager alike.  Their JSON form is ``harness.core.ops_json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from kvspec.spec.request import RequestStatus

# --- request lifecycle (scheduler-side changes to the Request object) ------------------------


@dataclass(frozen=True, slots=True)
class MMFeatureSpec:
    """A multimodal item: ``identifier`` (its content hash) occupies ``[offset, offset + length)``."""

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Create a request (vLLM ``Request(...)`` with the block hasher); no manager call."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    lora: tuple[str, str] | None = None  # (lora_name, lora_path); vLLM 0.33 keys on both
    mm_features: tuple[MMFeatureSpec, ...] = ()
    cache_salt: str | None = None
    skip_reading_prefix_cache: bool = False  # prompt-logprob requests
    # The ``prompt_embeds`` tensor, one hex string per prompt position: the row's raw bytes
    # (``tensor_data(prompt_embeds[i])``, float32 little-endian), all rows of equal length.
    prompt_embeds: tuple[str, ...] | None = None
    # Prompt logprobs asked with cache reads allowed, scored from this prompt row (vLLM 0.34
    # ``SamplingParams.prompt_logprob_start``; 0.33 ignores it for caching and reads the whole cache).
    prompt_logprob_start: int | None = None
    op: str = field(default="add_request", init=False)

    def prompt_embeds_rows(self) -> tuple[bytes, ...] | None:
        """The rows as bytes (what ``spec.hashing`` hashes), or None without embeddings."""
        return None if self.prompt_embeds is None else tuple(bytes.fromhex(r) for r in self.prompt_embeds)


@dataclass(frozen=True, slots=True)
class AppendOutputTokens:
    """``request.append_output_token_ids(tokens)``: extends ``all_token_ids`` and hashes new full blocks."""

    request_id: str
    token_ids: tuple[int, ...]
    op: str = field(default="append_output_tokens", init=False)


@dataclass(frozen=True, slots=True)
class SetSpecTokens:
    """``request.spec_token_ids = tokens`` (drafts: never in ``all_token_ids``, never hashed)."""

    request_id: str
    token_ids: tuple[int, ...]
    op: str = field(default="set_spec_tokens", init=False)


@dataclass(frozen=True, slots=True)
class SetNumComputedTokens:
    """``request.num_computed_tokens = n`` (after a step, a rejection, a preemption or a load)."""

    request_id: str
    num_computed_tokens: int
    op: str = field(default="set_num_computed_tokens", init=False)


@dataclass(frozen=True, slots=True)
class SetNumInFlightTokens:
    """``request.num_in_flight_tokens = n``: tokens of scheduled steps whose output is not yet
    processed (vLLM 0.33 async scheduling: ``_update_after_schedule`` adds, ``update_from_output``
    subtracts).  The manager frees window blocks and caches on ``num_computed_tokens - n``."""

    request_id: str
    num_in_flight_tokens: int
    op: str = field(default="set_num_in_flight_tokens", init=False)


@dataclass(frozen=True, slots=True)
class SetStatus:
    """``request.status = status``: a ``spec.request.RequestStatus`` value."""

    request_id: str
    status: str
    op: str = field(default="set_status", init=False)


# --- manager calls -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GetComputedBlocks:
    """``get_computed_blocks(request)``; outcome ``{"block_ids": [[...] per group], "num_hit_tokens": n}``.

    The target remembers the returned blocks; the next ``AllocateSlots`` of this request with
    ``use_computed_blocks`` passes them as ``new_computed_blocks``.
    """

    request_id: str
    op: str = field(default="get_computed_blocks", init=False)


@dataclass(frozen=True, slots=True)
class AllocateSlots:
    """``allocate_slots(...)``; outcome ``null`` (out of blocks) or ``{"block_ids": [[...] per group]}``."""

    request_id: str
    num_new_tokens: int
    num_new_computed_tokens: int = 0
    use_computed_blocks: bool = False
    num_lookahead_tokens: int = 0
    num_external_computed_tokens: int = 0
    delay_cache_blocks: bool = False
    num_encoder_tokens: int = 0
    full_sequence_must_fit: bool = False
    reserved_blocks: int = 0
    has_scheduled_reqs: bool = True  # the watermark applies only when another request is scheduled
    op: str = field(default="allocate_slots", init=False)

    def manager_kwargs(self, new_computed_blocks: Any) -> dict[str, Any]:
        """The keyword arguments of vLLM 0.33 ``allocate_slots`` after ``num_new_tokens``, with the
        target's own lookup result as ``new_computed_blocks`` (None when not used)."""
        return dict(
            num_new_computed_tokens=self.num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=self.num_lookahead_tokens,
            num_external_computed_tokens=self.num_external_computed_tokens,
            delay_cache_blocks=self.delay_cache_blocks,
            num_encoder_tokens=self.num_encoder_tokens,
            full_sequence_must_fit=self.full_sequence_must_fit,
            reserved_blocks=self.reserved_blocks,
            has_scheduled_reqs=self.has_scheduled_reqs,
        )


@dataclass(frozen=True, slots=True)
class Free:
    """``free(request)``; outcome ``null``."""

    request_id: str
    op: str = field(default="free", init=False)


@dataclass(frozen=True, slots=True)
class CacheBlocks:
    """``cache_blocks(request, num_computed_tokens)`` (P/D arrival, early caching); outcome ``null``."""

    request_id: str
    num_computed_tokens: int
    op: str = field(default="cache_blocks", init=False)


@dataclass(frozen=True, slots=True)
class RemoveSkippedBlocks:
    """``remove_skipped_blocks(request_id, num_computed_tokens)``; outcome ``null``."""

    request_id: str
    num_computed_tokens: int
    op: str = field(default="remove_skipped_blocks", init=False)


@dataclass(frozen=True, slots=True)
class EvictBlocks:
    """``evict_blocks(set(block_ids))`` (KV-load failure); outcome ``null``."""

    block_ids: tuple[int, ...]
    op: str = field(default="evict_blocks", init=False)


@dataclass(frozen=True, slots=True)
class ResetPrefixCache:
    """``reset_prefix_cache()``; outcome ``true`` or ``false``."""

    op: str = field(default="reset_prefix_cache", init=False)


@dataclass(frozen=True, slots=True)
class TakeEvents:
    """``take_events()``; outcome: the list of events in JSON form (see ``harness.core.observation``)."""

    op: str = field(default="take_events", init=False)


Op = (
    AddRequest
    | AppendOutputTokens
    | SetSpecTokens
    | SetNumComputedTokens
    | SetNumInFlightTokens
    | SetStatus
    | GetComputedBlocks
    | AllocateSlots
    | Free
    | CacheBlocks
    | RemoveSkippedBlocks
    | EvictBlocks
    | ResetPrefixCache
    | TakeEvents
)

OP_TYPES: dict[str, type] = {
    cast(str, cls.__dataclass_fields__["op"].default): cls
    for cls in (
        AddRequest,
        AppendOutputTokens,
        SetSpecTokens,
        SetNumComputedTokens,
        SetNumInFlightTokens,
        SetStatus,
        GetComputedBlocks,
        AllocateSlots,
        Free,
        CacheBlocks,
        RemoveSkippedBlocks,
        EvictBlocks,
        ResetPrefixCache,
        TakeEvents,
    )
}

REQUEST_STATUSES = tuple(s.value for s in RequestStatus)

# Operations that change only the scheduler's Request object, never the manager's state.  The first
# two also extend the request's block hashes (part of an observation); the others change nothing
# a target reports.
REQUEST_OPS = (AddRequest, AppendOutputTokens, SetSpecTokens, SetNumComputedTokens, SetNumInFlightTokens, SetStatus)


def changes_observation(op: Op) -> bool:
    """Can ``op`` change what ``Target.observe`` reports?  (Drafts, counts and statuses cannot.)"""
    return not isinstance(op, (SetSpecTokens, SetNumComputedTokens, SetNumInFlightTokens, SetStatus))
