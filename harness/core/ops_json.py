"""The JSON form of operations (``harness.core.ops``): language neutral, read strictly.

Plain objects with an ``"op"`` tag, ints, strings, lists and ``null``; bytes never appear in an
operation.  ``op_from_json`` checks each field's one exact JSON type and range
(``harness.core.strict_json``; ``harness/traces/trace.py`` lists them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from kvspec.harness.core.ops import OP_TYPES, REQUEST_STATUSES, AddRequest, MMFeatureSpec, Op
from kvspec.harness.core.strict_json import (
    MAX_EMBED_ROW_CHARS,
    MAX_MM_FEATURES,
    MAX_NAME_CHARS,
    MAX_NUM_BLOCKS,
    MAX_TEXT_CHARS,
    MAX_TOKEN_ID,
    MAX_TOKENS,
    TraceFormatError,
    describe,
    describe_names,
    want_bool,
    want_choice,
    want_int,
    want_int_list,
    want_list,
    want_object,
    want_str,
)

_HEX_BYTES = re.compile(r"(?:[0-9a-fA-F]{2})*")


def op_to_json(op: Op) -> dict[str, Any]:
    """``op`` in its JSON form (``op_from_json`` reads it back)."""
    out: dict[str, Any] = {"op": op.op}
    for f in dataclasses.fields(op):
        if f.name == "op":
            continue
        value = getattr(op, f.name)
        if f.name in ("prompt_embeds", "prompt_logprob_start") and value is None:
            continue  # absent unless used: traces without them read as before
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
    "prompt_logprob_start": lambda v, w: None if v is None else want_int(v, w, 0, MAX_TOKENS),
}


def _check_op(cls: type, kwargs: dict[str, Any], tag: str, where: str) -> None:
    """Checks across fields of one operation."""
    embeds = kwargs.get("prompt_embeds")
    if cls is AddRequest and kwargs.get("prompt_logprob_start") is not None and kwargs.get("skip_reading_prefix_cache"):
        raise TraceFormatError(f"{where}: {tag!r} sets prompt_logprob_start but skips reading the prefix cache")
    if cls is AddRequest and embeds is not None and len(embeds) != len(kwargs["prompt_token_ids"]):
        raise TraceFormatError(
            f"{where}: {tag!r} has {len(embeds)} prompt_embeds rows for {len(kwargs['prompt_token_ids'])} prompt tokens"
        )
