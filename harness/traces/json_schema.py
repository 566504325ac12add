"""The trace format as a JSON Schema (draft 2020-12), published as ``docs/trace.schema.json``:
``python -m kvspec.harness.traces.json_schema`` prints it (``--write`` updates the file).

The schema is built from the same definitions the reader checks against (``harness.core.ops``'
operation classes, ``harness.traces.trace``'s config fields, the bounds of ``harness.core.strict_json``
and ``harness.traces.schema``), so a field added to an operation without a schema here fails
(``FIELD_SCHEMAS``), and ``tests/harness/test_trace_json_schema.py`` checks the two against each
other: every trace kvspec writes validates, and mutated traces are refused by both or by neither,
except where JSON Schema cannot say what the reader checks.  What it cannot say, so only
``kvspec replay`` refuses:

- ``1.0`` where an int is expected (JSON Schema's integers include it; the reader wants ``1``);
- an object with a field twice, nesting deeper than 64 levels, a file over 16 MiB;
- the rules across fields: ``KVCacheConfig.validate`` (e.g. a window group's ``sliding_window``),
  a step's outcome against its config (a block id within the pool, one list per group), a finding's
  ``step`` within the steps, ``num_blocks x steps <= 2**24``, equal-width ``prompt_embeds`` rows;
- which release profiles exist (a string of the form ``vllm-...`` here).

Imports: harness.core, harness.traces, spec.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

from kvspec.harness.core import strict_json as J
from kvspec.harness.core.equality import RELATIONS
from kvspec.harness.core.ops import OP_TYPES, REQUEST_STATUSES
from kvspec.harness.targets.outcome_schema import EVENT_KEYS
from kvspec.harness.traces.schema import INT32, MAX_EVENTS, MAX_GROUPS, MAX_LONG_TEXT
from kvspec.harness.traces.trace import ATTENTION_KINDS, MAX_STEPS, TRACE_VERSION
from kvspec.spec.config import HashAlgo

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "trace.schema.json"
SCHEMA_ID = "https://kvspec.invalid/trace.schema.json"  # an identifier, not a download location


def integer(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def string(max_length: int, min_length: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "maxLength": max_length}
    if min_length:
        out["minLength"] = min_length
    return out


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, schema]}


def array(items: dict[str, Any], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": max_items}


def record(required: dict[str, Any], optional: dict[str, Any] | None = None, closed: bool = True) -> dict[str, Any]:
    """An object with ``required`` and ``optional`` fields (no others when ``closed``)."""
    out: dict[str, Any] = {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required)}
    if closed:
        out["additionalProperties"] = False
    return out


TOKEN_IDS = array(integer(0, J.MAX_TOKEN_ID), J.MAX_TOKENS)
BLOCK_ID = integer(INT32[0], INT32[1])  # as a target reported it (outcomes, witnesses, findings)
FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "request_id": string(J.MAX_NAME_CHARS, 1),
    "prompt_token_ids": TOKEN_IDS,
    "token_ids": TOKEN_IDS,
    "block_ids": array(integer(0, J.MAX_NUM_BLOCKS - 1), J.MAX_NUM_BLOCKS),
    "lora": nullable(
        {
            "type": "array",
            "prefixItems": [string(J.MAX_TEXT_CHARS, 1), string(J.MAX_TEXT_CHARS)],
            "items": False,
            "minItems": 2,
        }
    ),
    "mm_features": array(
        record(
            {
                "identifier": string(J.MAX_NAME_CHARS, 1),
                "offset": integer(0, J.MAX_TOKENS),
                "length": integer(1, J.MAX_TOKENS),
            }
        ),
        J.MAX_MM_FEATURES,
    ),
    "cache_salt": nullable(string(J.MAX_TEXT_CHARS)),
    "prompt_embeds": nullable(
        array({"type": "string", "pattern": "^(?:[0-9a-fA-F]{8})+$", "maxLength": J.MAX_EMBED_ROW_CHARS}, J.MAX_TOKENS)
    ),
    "status": {"enum": list(REQUEST_STATUSES)},
    "reserved_blocks": integer(0, J.MAX_NUM_BLOCKS),
    "prompt_logprob_start": nullable(integer(0, J.MAX_TOKENS)),
}
"""Each operation field by name (``harness.core.ops_json``'s parsers); a bool or int field not named
here is a flag or a token count."""


def get_field_schema(name: str, kind: str) -> dict[str, Any]:
    if name in FIELD_SCHEMAS:
        return FIELD_SCHEMAS[name]
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "int":
        return integer(0, J.MAX_TOKENS)
    raise KeyError(f"operation field {name!r} ({kind}) has no JSON Schema: add it to FIELD_SCHEMAS")


def get_outcome_schema(op: str) -> dict[str, Any]:
    """What a step of ``op`` records as its outcome (``null``: the reference raised or hung)."""
    tables = array(array(BLOCK_ID, J.MAX_NUM_BLOCKS), MAX_GROUPS)
    kinds = {"enum": list(EVENT_KEYS)}
    events = array({"type": "object", "properties": {"type": kinds}, "required": ["type"]}, MAX_EVENTS)
    found = {
        "get_computed_blocks": record({"block_ids": tables, "num_hit_tokens": {"type": "integer", "minimum": 0}}),
        "allocate_slots": record({"block_ids": tables}),
        "reset_prefix_cache": {"type": "boolean"},
        "take_events": events,
    }.get(op)
    return {"type": "null"} if found is None else nullable(found)


def get_step_schema(op: str, cls: type) -> dict[str, Any]:
    """One step of operation ``op``: its fields, and its outcome."""
    hints = {f.name: f for f in dataclasses.fields(cls) if f.name != "op"}
    required = {"op": {"const": op}, "outcome": get_outcome_schema(op)}
    optional = {}
    for name, f in hints.items():
        schema = get_field_schema(name, str(f.type))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required[name] = schema
        else:
            optional[name] = schema
    return record(required, optional)


def get_config_schema() -> dict[str, Any]:
    group = record(
        {"kind": {"enum": list(ATTENTION_KINDS)}, "block_size": integer(1, J.MAX_BLOCK_SIZE)},
        {
            "sliding_window": nullable(integer(1, J.MAX_TOKENS)),
            "attention_chunk_size": nullable(integer(1, J.MAX_TOKENS)),
        },
    )
    groups = {"type": "array", "items": group, "minItems": 1, "maxItems": MAX_GROUPS}
    return record(
        {"num_blocks": integer(1, J.MAX_NUM_BLOCKS), "groups": groups, "max_model_len": integer(1, J.MAX_TOKENS)},
        {
            "enable_caching": {"type": "boolean"},
            "hash_algo": {"enum": list(typing.get_args(HashAlgo))},
            "enable_kv_cache_events": {"type": "boolean"},
            "watermark": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "max_in_flight_tokens": nullable(integer(0, J.MAX_TOKENS)),
            "profile": {"type": "string", "pattern": "^vllm-"},
            "hash_block_size_override": nullable(integer(1, J.MAX_BLOCK_SIZE)),
        },
    )


def get_finding_schema() -> dict[str, Any]:
    return nullable(
        record(
            {
                "kind": string(J.MAX_NAME_CHARS, 1),
                "step": nullable(integer(0, MAX_STEPS - 1)),
                "message": string(MAX_LONG_TEXT),
            },
            {
                "op": nullable({"type": "object"}),
                "invariant": nullable(string(J.MAX_NAME_CHARS)),
                "blocks": array(BLOCK_ID, J.MAX_NUM_BLOCKS),
                "requests": array(string(J.MAX_NAME_CHARS, 1), J.MAX_NUM_BLOCKS),
                "witness": {"type": "object"},
                "traceback": nullable(string(MAX_LONG_TEXT)),
                "kv": nullable({"type": "object"}),
                "kv_markdown": nullable(string(MAX_LONG_TEXT)),
            },
            closed=False,
        )
    )


def get_trace_schema() -> dict[str, Any]:
    """The whole schema (module docstring)."""
    steps = [get_step_schema(op, cls) for op, cls in sorted(OP_TYPES.items())]
    trace = record(
        {
            "kvspec_trace": {"const": TRACE_VERSION},
            "config": get_config_schema(),
            "target": record({"name": string(J.MAX_NAME_CHARS, 1)}, {"version": string(J.MAX_TEXT_CHARS)}),
            "steps": {"type": "array", "items": {"oneOf": steps}, "maxItems": MAX_STEPS},
        },
        {
            "seed": nullable(integer(-(1 << 63), (1 << 64) - 1)),
            "profile": nullable(string(J.MAX_NAME_CHARS)),
            "family": nullable(string(J.MAX_NAME_CHARS)),
            "relation": {"enum": list(RELATIONS)},
            "finding": get_finding_schema(),
            "extra": {"type": "object"},
        },
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "kvspec trace",
        "description": "One kvspec run's operations and what broke (harness/traces/trace.py documents each field).",
        **trace,
    }


def render_schema() -> str:
    return json.dumps(get_trace_schema(), indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvspec.harness.traces.json_schema", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_PATH.name} in docs/")
    args = parser.parse_args(argv)
    if args.write:
        SCHEMA_PATH.write_text(render_schema(), encoding="utf-8")
        print(f"wrote {SCHEMA_PATH}")
    else:
        print(render_schema(), end="")


if __name__ == "__main__":
    main()
