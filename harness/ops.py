"""The abstract operations the harness drives a target with, and their JSON form.

A trace is a config followed by a list of these operations.  Each is either a call on the KV-cache
manager (vLLM 0.33 ``KVCacheManager`` method of the same meaning) or a change the scheduler makes to
a ``Request`` between calls (vLLM's scheduler owns the request object; the manager only reads it).
Every target applies exactly this vocabulary, so a trace replays on the spec, on vLLM, on ``impl``
or on a user's manager alike.  The JSON form is language neutral: plain objects with an ``"op"``
tag, ints, strings, lists and ``null``; bytes never appear in an operation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

from spec.request import RequestStatus

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
    """``take_events()``; outcome: the list of events in JSON form (see ``harness.observation``)."""

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


class TraceFormatError(ValueError):
    """A trace or operation that cannot be read; the message names the offending part."""


def op_to_json(op: Op) -> dict[str, Any]:
    out: dict[str, Any] = {"op": op.op}
    for f in dataclasses.fields(op):
        if f.name == "op":
            continue
        value = getattr(op, f.name)
        if f.name == "prompt_embeds" and value is None:
            continue  # absent unless used: traces without embeddings read as before
        if f.name == "mm_features":
            value = [dataclasses.asdict(m) for m in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def op_from_json(obj: Any, where: str = "operation") -> Op:
    """Parse one operation; raise ``TraceFormatError`` naming ``where`` and the problem."""
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected an object, got {type(obj).__name__}")
    tag = obj.get("op")
    cls = OP_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise TraceFormatError(f"{where}: unknown operation {tag!r} (known: {', '.join(sorted(OP_TYPES))})")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "op"}
    unknown = set(obj) - set(fields) - {"op", "outcome"}
    if unknown:
        raise TraceFormatError(f"{where}: unknown field(s) {sorted(unknown)} for {tag!r}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in obj:
            if f.default is dataclasses.MISSING:
                raise TraceFormatError(f"{where}: {tag!r} is missing field {name!r}")
            continue
        try:
            kwargs[name] = _parse_field(name, f, obj[name])
        except (TypeError, KeyError, IndexError, ValueError) as e:
            raise TraceFormatError(f"{where}: field {name!r} of {tag!r}: {e}") from None
    _check_op(cls, kwargs, str(tag), where)
    return cls(**kwargs)  # type: ignore[no-any-return]


def _parse_field(name: str, f: dataclasses.Field[Any], value: Any) -> Any:
    """One field's JSON value as the operation holds it; ``TypeError`` / ``ValueError`` say why not."""
    if name == "mm_features":
        return tuple(MMFeatureSpec(str(m["identifier"]), int(m["offset"]), int(m["length"])) for m in value)
    if name == "lora":
        return None if value is None else (str(value[0]), str(value[1]))
    if name == "prompt_embeds":
        return _parse_prompt_embeds(value)
    if name in ("prompt_token_ids", "token_ids", "block_ids"):
        if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            raise TypeError("expected a list of ints")
        return tuple(value)
    if isinstance(f.default, bool):
        if not isinstance(value, bool):
            raise TypeError("expected true or false")
    elif name in ("request_id", "status", "cache_salt", "identifier"):
        if not (isinstance(value, str) or (value is None and name == "cache_salt")):
            raise TypeError("expected a string")
    elif isinstance(f.default, int) or f.type in ("int",):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("expected an int")
    return value


def _parse_prompt_embeds(value: Any) -> tuple[str, ...] | None:
    """``null`` or a list of hex strings, one per prompt position, each a non-empty whole number of
    float32 elements (4 bytes), all of one length."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise TypeError("expected null or a list of hex strings (one row per prompt token)")
    for i, row in enumerate(value):
        try:
            raw = bytes.fromhex(row)
        except ValueError:
            raise ValueError(f"row {i} is not a hex string: {row[:20]!r}") from None
        if not raw or len(raw) % 4:
            raise ValueError(f"row {i} holds {len(raw)} bytes, not a whole number (>= 1) of float32 elements")
    if len({len(r) for r in value}) > 1:
        raise ValueError("rows differ in length (a tensor's rows all have one width)")
    return tuple(r.lower() for r in value)


def _check_op(cls: type, kwargs: dict[str, Any], tag: str, where: str) -> None:
    """Checks across fields of one operation."""
    if cls is SetStatus and kwargs["status"] not in REQUEST_STATUSES:
        raise TraceFormatError(f"{where}: status must be one of {REQUEST_STATUSES}, got {kwargs['status']!r}")
    embeds = kwargs.get("prompt_embeds")
    if cls is AddRequest and embeds is not None and len(embeds) != len(kwargs["prompt_token_ids"]):
        raise TraceFormatError(
            f"{where}: {tag!r} has {len(embeds)} prompt_embeds rows for {len(kwargs['prompt_token_ids'])} prompt tokens"
        )
    if cls is SetNumInFlightTokens and kwargs["num_in_flight_tokens"] < 0:
        raise TraceFormatError(f"{where}: num_in_flight_tokens must be >= 0, got {kwargs['num_in_flight_tokens']}")
