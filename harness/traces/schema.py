"""The trace schema's free-form parts: JSON values, operation outcomes, witness observations and
the finding, each parsed strictly and bounded (``harness.traces.trace`` documents the whole schema and
reads the file; an error is a ``TraceFormatError`` naming the JSON path)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kvspec.harness.core.ops import Op
from kvspec.harness.core.ops_json import op_from_json
from kvspec.harness.core.strict_json import (
    MAX_NAME_CHARS,
    MAX_NUM_BLOCKS,
    MAX_TEXT_CHARS,
    TraceFormatError,
    describe,
    key_path,
    want_int,
    want_list,
    want_object,
    want_str,
)
from kvspec.harness.targets.outcome_schema import outcome_problem

MAX_TRACE_BYTES = 16 << 20  # a trace file, and any string in it
MAX_GROUPS = 64
MAX_DEPTH = 64  # nesting of the free-form JSON parts (``expected``, ``kv``, ``extra``, ...)
MAX_EVENTS = 1 << 16  # events of one ``take_events`` outcome
MAX_LONG_TEXT = 1 << 20  # a finding's message, traceback, markdown
INT32 = (-(1 << 31), (1 << 31) - 1)  # block ids and counts a target reported

Parser = Callable[[Any, str], Any]


def nullable(parse: Parser) -> Parser:
    """``parse``, or ``null`` as None."""
    return lambda v, w: None if v is None else parse(v, w)


def int_in(lo: int, hi: int) -> Parser:
    return lambda v, w: want_int(v, w, lo, hi)


def str_of(max_chars: int, min_chars: int = 0) -> Parser:
    return lambda v, w: want_str(v, w, max_chars, min_chars)


# --- free-form JSON, outcomes, observations ------------------------------------------------------


def json_value(value: Any, where: str) -> Any:
    """``value`` if it is JSON nested at most ``MAX_DEPTH`` levels, with finite numbers and valid
    Unicode strings (an error names the JSON path of the first bad part)."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        v, w, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TraceFormatError(f"{w}: nested deeper than {MAX_DEPTH} levels")
        if type(v) is dict:
            for k, item in v.items():
                want_str(k, f"{w} (a field name)", MAX_TEXT_CHARS)
                stack.append((item, key_path(w, k), depth + 1))
        elif type(v) is list:
            stack.extend((item, f"{w}[{i}]", depth + 1) for i, item in enumerate(v))
        elif type(v) is str:
            want_str(v, w, MAX_TRACE_BYTES)
        elif type(v) is float and not math.isfinite(v):
            raise TraceFormatError(f"{w}: expected a finite number, got {describe(v)}")
        elif v is not None and type(v) not in (bool, int, float):
            raise TraceFormatError(f"{w}: not a JSON value: {describe(v)}")
    return value


def _block_id(v: Any, w: str) -> int:
    return want_int(v, w, *INT32)


def _list_of(parse: Parser, max_len: int) -> Parser:
    return lambda v, w: [parse(item, f"{w}[{i}]") for i, item in enumerate(want_list(v, w, max_len))]


def _map_of(parse_value: Parser, max_key_chars: int = MAX_NAME_CHARS) -> Parser:
    """An object whose field names are data (request ids, block ids): each value parsed."""

    def parse(v: Any, w: str) -> dict[str, Any]:
        obj = want_object(v, w, optional=None)
        for k in obj:
            want_str(k, f"{w} (a field name)", max_key_chars, 1)
        return {k: parse_value(item, key_path(w, k)) for k, item in obj.items()}

    return parse


_hash = str_of(MAX_TEXT_CHARS)


def outcome_from_json(op: Op, value: Any, where: str, num_groups: int, num_blocks: int) -> Any:
    """A recorded outcome of ``op``: null (none was recorded) or the form a target returns, checked by
    the one definition of those forms (``harness.targets.outcome_schema``, docs/targets.md)."""
    if value is None:
        return None
    bad = outcome_problem(op, value, num_groups, num_blocks)
    if bad is not None:
        raise TraceFormatError(f"{where}{bad.where.removeprefix('outcome')}: expected {bad.expected}, got {bad.got}")
    return value


def _fields(value: Any, where: str, parsers: dict[str, Parser]) -> dict[str, Any]:
    """An object with exactly the fields of ``parsers``, each parsed."""
    obj = want_object(value, where, parsers)
    return {k: parse(obj[k], key_path(where, k)) for k, parse in parsers.items()}


_int32 = int_in(*INT32)
_observation: Parser = lambda v, w: _fields(  # noqa: E731
    v,
    w,
    {
        "tables": _list_of(_map_of(_list_of(_block_id, MAX_NUM_BLOCKS)), MAX_GROUPS),
        "num_cached_block": _list_of(_map_of(nullable(_int32)), MAX_GROUPS),
        "blocks": _map_of(
            lambda b, bw: _fields(b, bw, {"ref_cnt": _int32, "hash": nullable(_hash), "free_pos": nullable(_int32)}),
            32,
        ),
        "free_queue": _list_of(_block_id, MAX_NUM_BLOCKS),
        "num_hashes": _map_of(_int32),
    },
)
WITNESS_OBSERVATIONS = ("spec_before", "target_before", "spec_after", "target_after")


def _witness(value: Any, where: str) -> dict[str, Any]:
    obj = want_object(value, where, optional=None)
    return {
        k: _observation(v, key_path(where, k)) if k in WITNESS_OBSERVATIONS else json_value(v, key_path(where, k))
        for k, v in obj.items()
    }


# --- the finding --------------------------------------------------------------------------------

_long_text = nullable(str_of(MAX_LONG_TEXT))
_FINDING_FIELDS: dict[str, Parser] = {
    "kind": str_of(MAX_NAME_CHARS, 1),
    "message": str_of(MAX_LONG_TEXT),
    "op": lambda v, w: None if v is None else _op_json(v, w),
    "expected": json_value,
    "actual": json_value,
    "invariant": nullable(str_of(MAX_NAME_CHARS)),
    "blocks": _list_of(_block_id, MAX_NUM_BLOCKS),
    "requests": _list_of(str_of(MAX_NAME_CHARS, 1), MAX_NUM_BLOCKS),
    "witness": _witness,
    "traceback": _long_text,
    "kv": lambda v, w: None if v is None else json_value(want_object(v, w, optional=None), w),
    "kv_markdown": _long_text,
}


def _op_json(value: Any, where: str) -> dict[str, Any]:
    """An operation in JSON form, checked (kept as JSON: the report names it)."""
    op_from_json(value, where)
    return dict(value)


def _finding_step(value: Any, where: str, num_steps: int) -> int | None:
    if value is None:
        return None
    if num_steps == 0:
        raise TraceFormatError(f"{where}: expected null (the trace has no steps), got {describe(value)}")
    return want_int(value, where, 0, num_steps - 1)


def finding_from_json(value: Any, where: str, num_steps: int) -> dict[str, Any] | None:
    """A finding: the known fields typed (``step`` within the ``num_steps`` steps), others free JSON."""
    if value is None:
        return None
    obj = want_object(value, where, ("kind", "step", "message"), None)
    out: dict[str, Any] = {}
    for k, v in obj.items():
        kw = key_path(where, k)
        want_str(k, f"{where} (a field name)", MAX_NAME_CHARS, 1)
        if k == "step":
            out[k] = _finding_step(v, kw, num_steps)
        else:
            out[k] = _FINDING_FIELDS.get(k, json_value)(v, kw)
    return out
