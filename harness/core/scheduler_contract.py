"""What a scheduler could send: the bounds vLLM 0.33's ``Scheduler.schedule`` keeps on the calls it
makes, checked on a whole operation list.

The spec accepts any call whose preconditions hold; a scheduler sends far fewer.  A trace reduced
against the spec alone can drift into calls no engine makes (a 1-token prompt allocating 3 new
tokens, a prompt longer than the model), which still trip the same check but describe nothing a
user can reproduce.  ``get_contract_problem`` names the first such call, so the reducer
(``harness.traces.reduce``) keeps only traces a scheduler could produce:

- a prompt fits the model (``max_model_len``; vLLM's input processing refuses a longer one);
- an allocation never passes ``max_model_len`` (the scheduler caps a request's new tokens there);
- an allocation schedules no more tokens than the request has: computed, hit, external and new
  tokens together at most ``num_tokens_with_spec`` plus the tokens in flight under async
  scheduling, give or take ``pad_allowance``: the most any allocation of the original trace went
  past them.  A one-token decode padded with draft slots (``pad_spec_decode``) goes past them, and
  under async scheduling with drafts the scheduler counts output and draft placeholders the
  manager never sees; a trace the scheduler made shows how far, and a reduction may not go further;
- every request added is used by a manager call (a lookup, an allocation or a free).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest, RequestBook
from kvspec.spec.config import KVCacheConfig

USES = (O.GetComputedBlocks, O.AllocateSlots, O.Free)


def compute_scheduled_total(r: BookRequest, op: O.AllocateSlots) -> int:
    """Request ``r``'s tokens once ``op`` is applied: computed, hit, external and new."""
    return r.num_computed_tokens + op.num_new_computed_tokens + op.num_external_computed_tokens + op.num_new_tokens


def compute_available(r: BookRequest) -> int:
    """The tokens a scheduler can schedule for ``r`` in all: its own with drafts, plus those in flight."""
    return r.num_tokens_with_spec + r.num_in_flight_tokens


def compute_overshoot(r: BookRequest, op: O.AllocateSlots) -> int:
    """Tokens ``op`` schedules beyond what request ``r`` has (0 when within)."""
    return max(0, compute_scheduled_total(r, op) - compute_available(r))


def get_pad_allowance(ops: Sequence[O.Op]) -> int:
    """The most any allocation of ``ops`` schedules beyond its request's tokens (draft padding)."""
    book: RequestBook[None] = RequestBook()
    most = 0
    for op in ops:
        if isinstance(op, O.AllocateSlots) and op.request_id in book:
            most = max(most, compute_overshoot(book.get(op.request_id), op))
        _note(book, op)
    return most


def get_contract_problem(
    config: KVCacheConfig, ops: Sequence[O.Op], pad_allowance: int = 0, *, require_used: bool = True
) -> str | None:
    """The first call of ``ops`` no scheduler would send, in words (None: every call could be);
    ``require_used=False`` leaves out the last rule (a run cut short leaves requests waiting)."""
    book: RequestBook[None] = RequestBook()
    used: set[str] = set()
    for i, op in enumerate(ops):
        if isinstance(op, O.AddRequest) and len(op.prompt_token_ids) > config.max_model_len:
            n = len(op.prompt_token_ids)
            return f"step {i}: {op.request_id}'s prompt of {n} tokens exceeds max_model_len {config.max_model_len}"
        if isinstance(op, USES):
            used.add(op.request_id)
        if isinstance(op, O.AllocateSlots) and op.request_id in book:
            problem = _allocation_problem(book.get(op.request_id), op, config, pad_allowance)
            if problem:
                return f"step {i}: {problem}"
        _note(book, op)
    unused = [rid for rid in book.requests if rid not in used] if require_used else []
    return f"request {unused[0]} is added and never used" if unused else None


def _note(book: RequestBook[None], op: O.Op) -> None:
    """Apply a request operation to ``book``; one the spec would refuse (a request added twice, or
    never) is left to the spec, which rejects the trace."""
    if isinstance(op, O.AddRequest):
        if op.request_id not in book:
            book.apply(op)
    elif isinstance(op, O.REQUEST_OPS) and op.request_id in book:
        book.apply(op)


def _allocation_problem(r: BookRequest, op: O.AllocateSlots, config: KVCacheConfig, pad_allowance: int) -> str | None:
    total = compute_scheduled_total(r, op)
    if total > config.max_model_len:
        return f"allocate_slots({r.request_id}) reaches {total} tokens, past max_model_len {config.max_model_len}"
    if compute_overshoot(r, op) <= pad_allowance:
        return None
    remaining = compute_available(r) - (total - op.num_new_tokens)
    return (
        f"allocate_slots({r.request_id}) schedules {op.num_new_tokens} new tokens where the request has "
        f"{max(remaining, 0)} left" + (f" (and {pad_allowance} of padding)" if pad_allowance else "")
    )
