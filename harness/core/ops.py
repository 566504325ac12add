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
import json
import re
from collections.abc import Callable, Iterable
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


class TraceFormatError(ValueError):
    """A trace or operation that cannot be read; the message names the offending part."""


# --- bounds of the JSON form (the whole trace schema is in harness/traces/trace.py's docstring) ---------

MAX_TOKENS = 1 << 20  # a token count or position, a token list's length, max_model_len, a window, a chunk
MAX_NUM_BLOCKS = 1 << 20  # num_blocks (SpecTarget.reset at this bound: 0.1 to 0.2 s); block ids are below it
MAX_BLOCK_SIZE = 1 << 16
MAX_TOKEN_ID = (1 << 31) - 1
MAX_NAME_CHARS = 256  # request ids, multimodal identifiers, names, kinds
MAX_TEXT_CHARS = 4096  # LoRA names and paths, cache salts
MAX_MM_FEATURES = 1024  # multimodal items of one request
MAX_EMBED_ROW_CHARS = 1 << 18  # one prompt_embeds row in hex: up to 32768 float32 elements

_HEX_BYTES = re.compile(r"(?:[0-9a-fA-F]{2})*")


def describe(value: Any) -> str:
    """``value`` as an error message shows it: strings as Python literals, other values in their JSON
    spelling (``true``, ``null``, ``2.5``), containers by size; cut short."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if isinstance(value, dict):
        return f"an object of {len(value)} field(s)"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if type(value) is int and value.bit_length() > 128:
        return f"an int of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def describe_names(names: Iterable[str]) -> str:
    """A few field names, sorted, for an 'unknown field(s)' message."""
    shown = sorted(names)
    return ", ".join(describe(n) for n in shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def key_path(where: str, key: str) -> str:
    """The JSON path of field ``key`` of the object at ``where`` (``a.b``, or ``a["3"]`` for other keys)."""
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{json.dumps(key)}]"


def want_int(value: Any, where: str, lo: int, hi: int) -> int:
    """``value`` if it is a JSON int (not a bool, not a float) in ``[lo, hi]``."""
    if type(value) is not int or not lo <= value <= hi:
        raise TraceFormatError(f"{where}: expected an int >= {lo} and <= {hi}, got {describe(value)}")
    return value


def want_bool(value: Any, where: str) -> bool:
    """``value`` if it is ``true`` or ``false`` (not 0 or 1)."""
    if type(value) is not bool:
        raise TraceFormatError(f"{where}: expected true or false, got {describe(value)}")
    return value


def want_str(value: Any, where: str, max_chars: int, min_chars: int = 0) -> str:
    """``value`` if it is a string of ``min_chars`` to ``max_chars`` characters of valid Unicode."""
    if type(value) is not str or not min_chars <= len(value) <= max_chars:
        what = "a non-empty string" if min_chars else "a string"
        raise TraceFormatError(f"{where}: expected {what} of at most {max_chars} characters, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceFormatError(f"{where}: not valid Unicode text (a lone surrogate): {describe(value)}") from None
    return value


def want_choice(value: Any, where: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of the strings ``choices``."""
    known = tuple(choices)
    if type(value) is not str or value not in known:
        raise TraceFormatError(f"{where}: expected one of {', '.join(map(repr, known))}, got {describe(value)}")
    return value


def want_list(value: Any, where: str, max_len: int) -> list[Any]:
    """``value`` if it is a JSON list of at most ``max_len`` items."""
    if type(value) is not list or len(value) > max_len:
        raise TraceFormatError(f"{where}: expected a list of at most {max_len} items, got {describe(value)}")
    return value


def want_int_list(value: Any, where: str, lo: int, hi: int, max_len: int) -> tuple[int, ...]:
    """``value`` as a tuple if it is a list of at most ``max_len`` ints, each in ``[lo, hi]``."""
    items = want_list(value, where, max_len)
    if not all(type(t) is int and lo <= t <= hi for t in items):
        for i, t in enumerate(items):
            want_int(t, f"{where}[{i}]", lo, hi)
    return tuple(items)


def want_object(
    value: Any, where: str, required: Iterable[str] = (), optional: Iterable[str] | None = ()
) -> dict[str, Any]:
    """``value`` if it is a JSON object with every ``required`` field and, unless ``optional`` is
    None (any other field allowed), no field outside ``required`` and ``optional``."""
    if type(value) is not dict:
        raise TraceFormatError(f"{where}: expected an object, got {describe(value)}")
    required = tuple(required)
    for name in required:
        if name not in value:
            raise TraceFormatError(f"{where}: missing field {name!r}")
    if optional is not None:
        unknown = set(value) - set(required) - set(optional)
        if unknown:
            raise TraceFormatError(f"{where}: unknown field(s) {describe_names(unknown)}")
    return value


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
    """Parse one operation; raise ``TraceFormatError`` naming ``where`` (its JSON path) and the problem.

    Each field has one exact JSON type and a range (``harness/traces/trace.py`` lists them): an int is never
    a bool or a float, a list never a string; nothing is coerced."""
    if type(obj) is not dict:
        raise TraceFormatError(f"{where}: expected an operation object, got {describe(obj)}")
    tag = obj.get("op")
    cls = OP_TYPES.get(tag) if type(tag) is str else None
    if cls is None:
        raise TraceFormatError(f"{where}: unknown operation {describe(tag)} (known: {', '.join(sorted(OP_TYPES))})")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "op"}
    unknown = set(obj) - set(fields) - {"op", "outcome"}
    if unknown:
        raise TraceFormatError(f"{where}: unknown field(s) {describe_names(unknown)} for {tag!r}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in obj:
            kwargs[name] = _parse_field(f, obj[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING:
            raise TraceFormatError(f"{where}: {tag!r} is missing field {name!r}")
    _check_op(cls, kwargs, str(tag), where)
    return cls(**kwargs)  # type: ignore[no-any-return]


def _parse_field(f: dataclasses.Field[Any], value: Any, where: str) -> Any:
    """One field's JSON value as the operation holds it (``where``: the field's JSON path)."""
    parse = _FIELD_PARSERS.get(f.name)
    if parse is not None:
        return parse(value, where)
    if f.type == "bool":
        return want_bool(value, where)
    if f.type == "int":  # a token count or position
        return want_int(value, where, 0, MAX_TOKENS)
    raise AssertionError(f"no JSON parser for operation field {f.name!r} ({f.type})")


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    return want_int_list(value, where, 0, MAX_TOKEN_ID, MAX_TOKENS)


def _block_ids(value: Any, where: str) -> tuple[int, ...]:
    return want_int_list(value, where, 0, MAX_NUM_BLOCKS - 1, MAX_NUM_BLOCKS)


def _lora(value: Any, where: str) -> tuple[str, str] | None:
    """``null`` or ``[lora_name, lora_path]``."""
    if value is None:
        return None
    if type(value) is not list or len(value) != 2:
        raise TraceFormatError(f"{where}: expected null or [lora_name, lora_path] (two strings), got {describe(value)}")
    return want_str(value[0], f"{where}[0]", MAX_TEXT_CHARS, 1), want_str(value[1], f"{where}[1]", MAX_TEXT_CHARS)


def _mm_features(value: Any, where: str) -> tuple[MMFeatureSpec, ...]:
    """A list of ``{"identifier": str, "offset": int >= 0, "length": int >= 1}``."""
    out = []
    for i, m in enumerate(want_list(value, where, MAX_MM_FEATURES)):
        mw = f"{where}[{i}]"
        want_object(m, mw, ("identifier", "offset", "length"))
        out.append(
            MMFeatureSpec(
                want_str(m["identifier"], f"{mw}.identifier", MAX_NAME_CHARS, 1),
                want_int(m["offset"], f"{mw}.offset", 0, MAX_TOKENS),
                want_int(m["length"], f"{mw}.length", 1, MAX_TOKENS),
            )
        )
    return tuple(out)


def _prompt_embeds(value: Any, where: str) -> tuple[str, ...] | None:
    """``null`` or a list of hex strings, one per prompt position, each a non-empty whole number of
    float32 elements (4 bytes), all of one length."""
    if value is None:
        return None
    if type(value) is not list or len(value) > MAX_TOKENS or not all(type(r) is str for r in value):
        raise TraceFormatError(
            f"{where}: expected null or a list of hex strings (one row per prompt token), got {describe(value)}"
        )
    for i, row in enumerate(value):
        if len(row) > MAX_EMBED_ROW_CHARS or not _HEX_BYTES.fullmatch(row):
            raise TraceFormatError(
                f"{where}[{i}]: not a hex string of at most {MAX_EMBED_ROW_CHARS} digits: {describe(row)}"
            )
        if not row or len(row) % 8:
            raise TraceFormatError(
                f"{where}[{i}]: holds {len(row) // 2} bytes, not a whole number (>= 1) of float32 elements"
            )
    if len({len(r) for r in value}) > 1:
        raise TraceFormatError(f"{where}: rows differ in length (a tensor's rows all have one width)")
    return tuple(r.lower() for r in value)


_FIELD_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "request_id": lambda v, w: want_str(v, w, MAX_NAME_CHARS, 1),
    "prompt_token_ids": _token_ids,
    "token_ids": _token_ids,
    "block_ids": _block_ids,
    "lora": _lora,
    "mm_features": _mm_features,
    "cache_salt": lambda v, w: None if v is None else want_str(v, w, MAX_TEXT_CHARS),
    "prompt_embeds": _prompt_embeds,
    "status": lambda v, w: want_choice(v, w, REQUEST_STATUSES),
    "reserved_blocks": lambda v, w: want_int(v, w, 0, MAX_NUM_BLOCKS),
}


def _check_op(cls: type, kwargs: dict[str, Any], tag: str, where: str) -> None:
    """Checks across fields of one operation."""
    embeds = kwargs.get("prompt_embeds")
    if cls is AddRequest and embeds is not None and len(embeds) != len(kwargs["prompt_token_ids"]):
        raise TraceFormatError(
            f"{where}: {tag!r} has {len(embeds)} prompt_embeds rows for {len(kwargs['prompt_token_ids'])} prompt tokens"
        )
