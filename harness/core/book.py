"""The request book: the scheduler-side state of every request, kept once for every target.

In vLLM 0.33 the scheduler owns each ``Request`` and changes it between manager calls (tokens
appended, drafts set, ``num_computed_tokens`` and ``status`` moved); the manager only reads it.
``RequestBook.apply`` is the one place where the request operations of ``harness.core.ops`` change
that state, on plain ``BookRequest`` records.  Beside each record the book holds a target's own
request object (a spec ``Request`` value, a vLLM ``Request``, an ``impl`` request), which the
target's adapter builds and updates through its hooks (``harness.targets.adapter``), and the
request's last prefix-cache lookup, kept until the allocation that consumes it.

Every user of request state shares this: the targets, the lockstep driver, the KV-content
oracle and the scheduler model each keep a ``RequestBook``; none keeps its own copy of the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kvspec.harness.core import ops as O
from kvspec.spec.request import RequestStatus

N = TypeVar("N")


@dataclass
class BookRequest:
    """What the scheduler has told the manager about one request (vLLM 0.33 ``Request`` fields)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    lora: tuple[str, str] | None = None
    mm_features: tuple[O.MMFeatureSpec, ...] = ()
    cache_salt: str | None = None
    skip_reading_prefix_cache: bool = False
    prompt_embeds: tuple[str, ...] | None = None  # hex rows, as ``AddRequest`` carries them
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: tuple[int, ...] = ()
    num_computed_tokens: int = 0
    num_in_flight_tokens: int = 0  # async scheduling: scheduled, output not yet processed
    status: str = RequestStatus.WAITING.value
    prompt_logprob_start: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return [*self.prompt_token_ids, *self.output_token_ids]


def new_book_request(op: O.AddRequest) -> BookRequest:
    return BookRequest(
        op.request_id,
        tuple(op.prompt_token_ids),
        op.lora,
        tuple(op.mm_features),
        op.cache_salt,
        op.skip_reading_prefix_cache,
        op.prompt_embeds,
        prompt_logprob_start=op.prompt_logprob_start,
    )


def apply_request_op(r: BookRequest, op: O.Op) -> None:
    """The change a request operation makes to the scheduler's request (not ``AddRequest``)."""
    if isinstance(op, O.AppendOutputTokens):
        r.output_token_ids.extend(op.token_ids)
    elif isinstance(op, O.SetSpecTokens):
        r.spec_token_ids = tuple(op.token_ids)
    elif isinstance(op, O.SetNumComputedTokens):
        r.num_computed_tokens = op.num_computed_tokens
    elif isinstance(op, O.SetNumInFlightTokens):
        r.num_in_flight_tokens = op.num_in_flight_tokens
    elif isinstance(op, O.SetStatus):
        r.status = op.status
    else:
        raise AssertionError(f"{op.op} is not a request operation")


class RequestBook(Generic[N]):
    """The requests of one run: records, the holder's native objects, pending lookups."""

    def __init__(self) -> None:
        self.requests: dict[str, BookRequest] = {}
        self.native: dict[str, N] = {}
        self._lookups: dict[str, Any] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.requests

    def get(self, request_id: str) -> BookRequest:
        """The record of a known request; ``ValueError`` names an unknown one."""
        try:
            return self.requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r} (no add_request before it)") from None

    def get_native(self, request_id: str) -> N:
        self.get(request_id)
        return self.native[request_id]

    def apply(self, op: O.Op) -> BookRequest:
        """Apply one request operation (``harness.core.ops.REQUEST_OPS``) and return the record."""
        if isinstance(op, O.AddRequest):
            if op.request_id in self.requests:
                raise ValueError(f"request {op.request_id!r} added twice")
            r = self.requests[op.request_id] = new_book_request(op)
            return r
        assert isinstance(op, O.REQUEST_OPS), f"{op.op} is not a request operation"
        r = self.get(op.request_id)
        apply_request_op(r, op)
        return r

    # --- prefix-cache lookups ------------------------------------------------------------------

    def remember_lookup(self, request_id: str, blocks: Any) -> None:
        """Keep ``get_computed_blocks``' result for the request's next allocation."""
        self._lookups[request_id] = blocks

    def take_lookup(self, op: O.AllocateSlots) -> Any:
        """The lookup an allocation passes as ``new_computed_blocks``, consumed once (as vLLM's
        scheduler passes it to one ``allocate_slots``); None unless ``use_computed_blocks``."""
        if not op.use_computed_blocks:
            return None
        if op.request_id not in self._lookups:
            raise ValueError(f"allocate_slots({op.request_id!r}) uses computed blocks, but none were looked up")
        return self._lookups.pop(op.request_id)

    def forget_lookup(self, request_id: str) -> None:
        self._lookups.pop(request_id, None)
