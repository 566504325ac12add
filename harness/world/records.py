"""What kvspec's scheduler model keeps: its knobs, its record of each request, its batches, and how a
record changes.

``SchedConfig``: the scheduler knobs that change which manager calls happen; ``SReq``: the
scheduler's record of a request; ``Batch``: one step's ``SchedulerOutput``; ``RequestChanges``: the
one way a record changes, the book's rule on it (``harness.core.book.apply_request_op``) and the
same operation emitted, so the scheduler's records and every target's request book stay alike.
Shared by ``harness.world.scheduler`` and its KV-transfer side (``harness.world.transfer``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest, apply_request_op
from kvspec.spec.releases.profile import BASE, Profile
from kvspec.spec.request import RequestStatus


@dataclass(frozen=True)
class SchedConfig:
    """The scheduler knobs that change which manager calls happen."""

    token_budget: int  # max_num_scheduled_tokens (chunked prefill always on)
    max_num_seqs: int
    max_model_len: int
    block_size: int  # scheduler_block_size (LCM of the groups' block sizes)
    num_spec_tokens: int = 0  # k drafts per step; 0 = no speculative decoding
    num_lookahead_tokens: int = 0  # EAGLE / draft-model lookahead slots (0 or k)
    connector: bool = False  # a KV connector (P/D) answers get_num_new_matched_tokens
    single_group: bool = True  # invalid-block recovery needs one group (vLLM 0.33)
    # vLLM 0.33 scheduler_reserve_full_isl: admissions pass full_sequence_must_fit (the whole prompt
    # must fit, window kinds capped by their recycling bound).
    reserve_full_isl: bool = False
    # vLLM 0.33 ``AsyncScheduler`` (``scheduler_config.async_scheduling``): two batches in flight.
    async_scheduling: bool = False
    # An encoder-decoder model (a cross-attention group): encoder inputs are scheduled on admission.
    encoder_decoder: bool = False
    # Requests may carry prompt embeddings instead of token ids (the workload's choice).
    prompt_embeds: bool = False
    # The release modelled (``spec.releases``): the config's profile.
    profile: Profile = BASE
    # Inputs some release's block keys cannot tell apart (harness.world.request_keys).
    request_keys: bool = False


@dataclass
class SReq(BookRequest):
    """The scheduler's record of a request: the book's fields, changed only through
    ``harness.core.book.apply_request_op`` as the ops are emitted, plus the scheduler's own facts."""

    num_preemptions: int = 0
    recv: str | None = None  # None | "pending" | "done" | "failed"
    load_poisoned: bool = False  # pending load holding a block another load reported invalid (fails on arrival)
    aborted: bool = False  # finished while its remote KV was still loading (free delayed)
    sync_ext_this_step: int = 0  # external tokens loaded synchronously in the current step
    num_output_placeholders: int = 0  # async: sampled tokens scheduled but not yet returned
    # async with drafts: the ``AsyncScheduler``'s ``[-1] * k`` draft placeholders in ``spec_token_ids``
    # (scheduler-only: the worker fills them in, so they are not emitted as ``SetSpecTokens``)
    num_spec_placeholders: int = 0
    num_stale_output_tokens: int = 0  # async: in-flight tokens of steps before a preemption
    is_prefill_chunk: bool = False  # its last scheduled step left prompt to compute (0.33 ``Request``)


@dataclass
class Batch:
    """One ``SchedulerOutput``: tokens per request, the padded and draft-carrying requests, and the
    requests whose step samples a token (not a partial prefill chunk when scheduled)."""

    scheduled: dict[str, int] = field(default_factory=dict)
    padded: set[str] = field(default_factory=set)
    drafts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    samples: set[str] = field(default_factory=set)


class RequestChanges:
    """Changes to the scheduler's records of requests, each applied by the book's rule and emitted
    (``emit`` applies it to the spec and the target); a change to the value a record holds already
    is no change and emits nothing."""

    def __init__(self, emit: Callable[[O.Op], Any]) -> None:
        self.emit = emit

    def apply(self, r: SReq, op: O.Op) -> None:
        """A change to the request object: the book's rule on the scheduler's record, then emitted."""
        apply_request_op(r, op)
        self.emit(op)

    def set_computed(self, r: SReq, n: int) -> None:
        if r.num_computed_tokens != n:
            self.apply(r, O.SetNumComputedTokens(r.request_id, n))

    def set_in_flight(self, r: SReq, n: int) -> None:
        if r.num_in_flight_tokens != n:
            self.apply(r, O.SetNumInFlightTokens(r.request_id, n))

    def set_status(self, r: SReq, status: RequestStatus) -> None:
        if r.status != status:
            self.apply(r, O.SetStatus(r.request_id, status.value))

    def set_spec(self, r: SReq, drafts: tuple[int, ...]) -> None:
        if r.spec_token_ids != drafts:
            self.apply(r, O.SetSpecTokens(r.request_id, drafts))
