"""The trace file: a language-neutral, versioned record of one fuzzing run (``trace.json``).

A trace is data that ``kvspec replay`` and ``kvspec report`` read from anywhere (a CI artifact, a
bug report), so reading it is strict and bounded: one schema, checked field by field, nothing
coerced (an int is never a bool or a float, a list never a string), every size bounded.  Any
departure raises ``TraceFormatError`` (from ``harness.core.strict_json``) naming the file and the JSON path of
the bad field, e.g. ``trace.json: config.groups[0].sliding_window: expected an int >= 1 and <= 1048576,
got 2.5``; the CLI turns it into exit 2.  A trace never chooses code to run: its ``target.name`` is a
label, which ``kvspec replay`` uses only if it is a built-in target (``harness.traces.replay``).
The same schema is published as a JSON Schema, ``docs/trace.schema.json``
(``harness.traces.json_schema``: generated from these definitions, and tested to refuse what this
reader refuses, but for the rules across fields it cannot express).

Schema (version 1); ``T`` = ``MAX_TOKENS`` = 2**20, ``B`` = ``MAX_NUM_BLOCKS`` = 2**20::

    {"kvspec_trace": 1,                      the int 1 (not 1.0, not true)
     "config": {                             KVCacheConfig
        "num_blocks": int in [1, B],         (SpecTarget.reset at B: 0.1 to 0.2 s)
        "groups": [ {"kind": "full" | "sliding_window" | "chunked_local" | "cross",
                     "block_size": int in [1, 2**16],
                     "sliding_window"?: null | int in [1, T],
                     "attention_chunk_size"?: null | int in [1, T]} ]   (1 to 64 groups),
        "max_model_len": int in [1, T],
        "enable_caching"?: bool, "enable_kv_cache_events"?: bool,
        "hash_algo"?: "sha256" | "sha256_cbor",
        "watermark"?: number in [0, 1),
        "max_in_flight_tokens"?: null | int in [0, T],
        "profile"?: "vllm-<release>" (spec.releases.line.RELEASES; legacy "vllm-0.33") | "vllm-0.20-free-order",
        "hash_block_size_override"?: null | int in [1, 2**16]},
        (then ``KVCacheConfig.validate``: the cross-field rules)
     "target": {"name": non-empty str (<= 256 chars), "version"?: str (<= 4096 chars)},
     "steps": [ {"op": ..., <operation fields>, "outcome": <outcome>} ]   (at most 10,000 steps,
        and num_blocks x steps <= 2**24: replay compares the whole pool after each step, about
        0.8 us per block and step, so a 2**20-block pool replays at most 16 steps, about 13 s),
     "seed"?: null | int in [-2**63, 2**64),
     "profile"?: null | str (<= 256 chars),  "family"?: null | str (<= 256 chars),
     "relation"?: "exact" | "outcomes" | "invariants"  (harness.core.equality.RELATIONS; default "exact"),
     "finding"?: null | {
        "kind": non-empty str (<= 256 chars), "step": null | int in [0, len(steps)),
        "message": str (<= 2**20 chars),
        "op"?: null | <operation>, "expected"?: JSON, "actual"?: JSON,  (what a target returned)
        "invariant"?: null | str, "blocks"?: [block id], "requests"?: [request id],
        "witness"?: {"spec_before" | "target_before" | "spec_after" | "target_after"?: <observation>,
                     other fields: JSON},
        "traceback"?: null | str (<= 2**20 chars), "kv"?: null | JSON object,
        "kv_markdown"?: null | str (<= 2**20 chars),
        other fields (e.g. a proof's "claim", "model"): JSON},
     "extra"?: JSON object}

``?`` marks an optional field; no other field is allowed where the schema lists the fields.
Operation fields (``harness.core.ops_json.op_from_json``): request ids non-empty strings of at most 256
characters; token ids ints in [0, 2**31); token lists and counts at most ``T``; ``block_ids`` ints
in [0, B); ``lora`` null or [name, path] (two strings of at most 4096 characters); ``mm_features``
at most 1024 objects {"identifier": str, "offset": int in [0, T], "length": int in [1, T]};
``cache_salt`` null or a string; ``prompt_embeds`` null or one hex row per prompt token; booleans
``true``/``false`` only; ``status`` a ``spec.request.RequestStatus`` value.

Outcomes (docs/targets.md; ``null`` is always allowed: the reference raised or hung there):
``get_computed_blocks`` {"block_ids": [[block id] per group], "num_hit_tokens": int >= 0};
``allocate_slots`` {"block_ids": [[block id] per group]}; ``reset_prefix_cache`` a bool;
``take_events`` a list (at most 2**16) of events {"type": "BlockStored", "block_hashes": [str],
"parent_block_hash": null | str, "token_ids": [token id], "block_size": int, "group_id": int} |
{"type": "BlockRemoved", "block_hashes": [str], "group_id": int} | {"type": "AllBlocksCleared"};
every other operation ``null``.  Block ids a target reported (outcomes, witnesses, a finding's
``blocks``) are ints in [-2**31, 2**31): a buggy target's ids are kept as they were.
An observation (witness) is {"tables": [{request id: [block id]}], "num_cached_block":
[{request id: null | int}], "blocks": {str: {"ref_cnt": int, "hash": null | str, "free_pos": null |
int}}, "free_queue": [block id], "num_hashes": {request id: int}} (ints 32-bit).

"JSON" above is any JSON value nested at most ``MAX_DEPTH`` (64) levels, with finite numbers and
valid Unicode strings.  The file: at most ``MAX_TRACE_BYTES`` (16 MiB) of UTF-8 JSON, no object
with a field twice; deeper nesting, NaN and Infinity are refused.  Each step's ``outcome`` is the
expected outcome: the reference spec's (or, when the trace was recorded without a reference, the
target's).

``harness.traces.folders.find_traces`` expands folders: it walks them (not into hidden folders or virtualenvs), skips
``.json`` files that are not kvspec traces (no top-level ``kvspec_trace`` field) and reports them as
skipped; a file that is a trace but a bad one is an error.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.harness.core.equality import RELATIONS
from kvspec.harness.core.ops import Op
from kvspec.harness.core.ops_json import op_from_json, op_to_json
from kvspec.harness.core.strict_json import (
    MAX_BLOCK_SIZE,
    MAX_NAME_CHARS,
    MAX_NUM_BLOCKS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    TraceFormatError,
    describe,
    describe_names,
    want_bool,
    want_choice,
    want_int,
    want_list,
    want_object,
    want_str,
)
from kvspec.harness.traces.schema import (
    MAX_GROUPS,
    MAX_TRACE_BYTES,
    Parser,
    finding_from_json,
    int_in,
    json_value,
    nullable,
    outcome_from_json,
    str_of,
)
from kvspec.spec.config import AttentionKind, AttentionSpec, ConfigError, HashAlgo, KVCacheConfig
from kvspec.spec.releases.line import UnknownRelease, all_profile_names, profile_named
from kvspec.spec.releases.profile import Profile
from kvspec.spec.types import BlockCount, TokenCount

TRACE_VERSION = 1

MAX_STEPS = 10_000
# Replay work: lockstep observes and compares the whole pool after every step (about 0.8 us per block
# and step), so num_blocks x steps is bounded too: 2**24 is about 13 s of replay.
MAX_BLOCK_STEPS = 1 << 24


@dataclass
class Trace:
    config: KVCacheConfig
    steps: list[tuple[Op, Any]]  # (operation, expected outcome in JSON form)
    target_name: str = "spec"
    target_version: str = ""
    seed: int | None = None
    profile: str | None = None
    family: str | None = None
    relation: str = "exact"
    finding: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ops(self) -> list[Op]:
        return [op for op, _ in self.steps]


# --- config <-> JSON ---------------------------------------------------------------------------


def config_to_json(config: KVCacheConfig) -> dict[str, Any]:
    return {
        "num_blocks": config.num_blocks,
        "groups": [
            {
                "kind": g.kind,
                "block_size": g.block_size,
                "sliding_window": g.sliding_window,
                "attention_chunk_size": g.attention_chunk_size,
            }
            for g in config.groups
        ],
        "max_model_len": config.max_model_len,
        "enable_caching": config.enable_caching,
        "hash_algo": config.hash_algo,
        "enable_kv_cache_events": config.enable_kv_cache_events,
        "watermark": config.watermark,
        "max_in_flight_tokens": config.max_in_flight_tokens,
        "profile": config.profile.name,
        "hash_block_size_override": config.hash_block_size_override,
    }


def _profile(value: Any, where: str) -> Profile:
    """A release profile by name (``vllm-0.34.0``; the legacy ``vllm-0.33`` reads as ``vllm-0.33.0``)."""
    if not isinstance(value, str):
        raise TraceFormatError(f"{where}: expected one of {', '.join(all_profile_names())}, got {describe(value)}")
    try:
        return profile_named(value)
    except UnknownRelease as e:
        raise TraceFormatError(f"{where}: {e}") from None


def _watermark(value: Any, where: str) -> float:
    if type(value) not in (int, float) or not 0 <= value < 1:
        raise TraceFormatError(f"{where}: expected a number >= 0 and < 1, got {describe(value)}")
    return float(value)


_CONFIG_REQUIRED = ("num_blocks", "groups", "max_model_len")
_CONFIG_OPTIONAL: dict[str, Parser] = {
    "enable_caching": want_bool,
    "hash_algo": lambda v, w: want_choice(v, w, typing.get_args(HashAlgo)),
    "enable_kv_cache_events": want_bool,
    "watermark": _watermark,
    "max_in_flight_tokens": nullable(int_in(0, MAX_TOKENS)),
    "profile": lambda v, w: _profile(v, w),
    "hash_block_size_override": nullable(int_in(1, MAX_BLOCK_SIZE)),
}
ATTENTION_KINDS: tuple[str, ...] = typing.get_args(AttentionKind)


def _group(g: Any, where: str) -> AttentionSpec:
    want_object(g, where, ("kind", "block_size"), ("sliding_window", "attention_chunk_size"))
    kind = g["kind"]
    if type(kind) is not str or kind not in ATTENTION_KINDS:
        raise TraceFormatError(
            f"{where}.kind: unknown attention kind {describe(kind)} (known: {', '.join(ATTENTION_KINDS)})"
        )
    return AttentionSpec(
        kind,  # type: ignore[arg-type]
        TokenCount(want_int(g["block_size"], f"{where}.block_size", 1, MAX_BLOCK_SIZE)),
        nullable(int_in(1, MAX_TOKENS))(g.get("sliding_window"), f"{where}.sliding_window"),
        nullable(int_in(1, MAX_TOKENS))(g.get("attention_chunk_size"), f"{where}.attention_chunk_size"),
    )


def config_from_json(obj: Any, where: str = "config") -> KVCacheConfig:
    """Parse and validate a config; raise ``TraceFormatError`` naming the bad field's JSON path."""
    want_object(obj, where, _CONFIG_REQUIRED, _CONFIG_OPTIONAL)
    groups = want_list(obj["groups"], f"{where}.groups", MAX_GROUPS)
    kwargs = {name: parse(obj[name], f"{where}.{name}") for name, parse in _CONFIG_OPTIONAL.items() if name in obj}
    config = KVCacheConfig(
        num_blocks=BlockCount(want_int(obj["num_blocks"], f"{where}.num_blocks", 1, MAX_NUM_BLOCKS)),
        groups=tuple(_group(g, f"{where}.groups[{i}]") for i, g in enumerate(groups)),
        max_model_len=TokenCount(want_int(obj["max_model_len"], f"{where}.max_model_len", 1, MAX_TOKENS)),
        **kwargs,
    )
    try:
        return config.validate()
    except ConfigError as e:
        raise TraceFormatError(f"{where}: {e}") from None


# --- trace <-> JSON ----------------------------------------------------------------------------


def trace_to_json(trace: Trace) -> dict[str, Any]:
    return {
        "kvspec_trace": TRACE_VERSION,
        "config": config_to_json(trace.config),
        "seed": trace.seed,
        "profile": trace.profile,
        "family": trace.family,
        "relation": trace.relation,
        "target": {"name": trace.target_name, "version": trace.target_version},
        "steps": [{**op_to_json(op), "outcome": outcome} for op, outcome in trace.steps],
        "finding": trace.finding,
        **({"extra": trace.extra} if trace.extra else {}),
    }


_TOP_REQUIRED = ("kvspec_trace", "config", "target", "steps")
_TOP_OPTIONAL = ("seed", "profile", "family", "relation", "finding", "extra")


def trace_from_json(obj: Any, where: str = "trace") -> Trace:
    """Parse and validate a trace (the module docstring's schema); ``TraceFormatError`` names
    ``where`` (the file) and the JSON path of the bad field."""
    try:
        return _trace(obj)
    except TraceFormatError as e:
        raise TraceFormatError(f"{where}: {e}") from None


def _trace(obj: Any) -> Trace:
    if type(obj) is not dict:
        raise TraceFormatError(f"expected a JSON object at the top level, got {describe(obj)}")
    if "kvspec_trace" not in obj:
        raise TraceFormatError("not a kvspec trace (no 'kvspec_trace' version field)")
    version = obj["kvspec_trace"]
    if type(version) is not int or version != TRACE_VERSION:
        raise TraceFormatError(
            f"kvspec_trace: unsupported trace version {describe(version)} (this kvspec reads version {TRACE_VERSION})"
        )
    unknown = set(obj) - set(_TOP_REQUIRED) - set(_TOP_OPTIONAL)
    if unknown:
        raise TraceFormatError(f"unknown top-level field(s) {describe_names(unknown)}")
    for name in _TOP_REQUIRED:
        if name not in obj:
            raise TraceFormatError(f"missing field {name!r}")
    config = config_from_json(obj["config"], "config")
    target = want_object(obj["target"], "target", ("name",), ("version",))
    steps = _steps(obj["steps"], config)
    if config.num_blocks * len(steps) > MAX_BLOCK_STEPS:
        raise TraceFormatError(
            f"steps: {len(steps)} steps on {config.num_blocks} blocks: num_blocks x steps must be <= "
            f"{MAX_BLOCK_STEPS} (the bound on a replay's work)"
        )
    return Trace(
        config=config,
        steps=steps,
        target_name=want_str(target["name"], "target.name", MAX_NAME_CHARS, 1),
        target_version=want_str(target.get("version", ""), "target.version", MAX_TEXT_CHARS),
        seed=nullable(int_in(-(1 << 63), (1 << 64) - 1))(obj.get("seed"), "seed"),
        profile=nullable(str_of(MAX_NAME_CHARS))(obj.get("profile"), "profile"),
        family=nullable(str_of(MAX_NAME_CHARS))(obj.get("family"), "family"),
        relation=_relation(obj.get("relation", "exact")),
        finding=finding_from_json(obj.get("finding"), "finding", len(steps)),
        extra=json_value(want_object(obj.get("extra", {}), "extra", optional=None), "extra"),
    )


def _relation(value: Any) -> str:
    if type(value) is not str or value not in RELATIONS:
        raise TraceFormatError(f"relation: unknown relation {describe(value)} (known: {', '.join(RELATIONS)})")
    return value


def _steps(value: Any, config: KVCacheConfig) -> list[tuple[Op, Any]]:
    steps: list[tuple[Op, Any]] = []
    for i, s in enumerate(want_list(value, "steps", MAX_STEPS)):
        sw = f"steps[{i}]"
        op = op_from_json(s, sw)
        if "outcome" not in s:
            raise TraceFormatError(f"{sw}: missing field 'outcome'")
        outcome = outcome_from_json(op, s["outcome"], f"{sw}.outcome", len(config.groups), config.num_blocks)
        steps.append((op, outcome))
    return steps


# --- files ---------------------------------------------------------------------------------------


class _Duplicate(Exception):
    """An object with a field twice (JSON readers disagree on which one counts)."""


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(f"an object has the field {describe(k)} twice")
            seen.add(k)
    return obj


def parse_json(data: bytes | str, where: str) -> Any:
    """The JSON value of a trace file's contents (at most ``MAX_TRACE_BYTES`` of UTF-8)."""
    if isinstance(data, bytes):
        if len(data) > MAX_TRACE_BYTES:
            raise TraceFormatError(f"{where}: larger than {MAX_TRACE_BYTES} bytes, the bound on a trace file")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceFormatError(
                f"{where}: not UTF-8 text: {e.reason} (byte {data[e.start]:#04x} at offset {e.start})"
            ) from None
    try:
        return json.loads(data, object_pairs_hook=_unique_fields)
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{where}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise TraceFormatError(f"{where}: JSON nested too deeply to read (a trace nests a few levels)") from None
    except _Duplicate as e:
        raise TraceFormatError(f"{where}: not a valid trace: {e}") from None
    except ValueError:  # an int of more digits than Python converts (4300)
        raise TraceFormatError(f"{where}: not valid JSON: a number too long to read{_long_number_at(data)}") from None


def _long_number_at(text: str) -> str:
    """`` at line L column C`` of the first run of over 4300 digits in ``text`` (or nothing)."""
    m = re.search(r"\d{4301,}", text)
    if m is None:
        return ""
    line = text.count("\n", 0, m.start()) + 1
    return f" at line {line} column {m.start() - text.rfind(chr(10), 0, m.start())}"


def read_bytes(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{path}: larger than {MAX_TRACE_BYTES} bytes, the bound on a trace file")
    return data


def loads_trace(data: bytes | str, where: str = "trace") -> Trace:
    """Parse and validate the contents of a trace file (``where`` names it in errors)."""
    return trace_from_json(parse_json(data, where), where)


def read_trace(path: str | Path) -> Trace:
    """Read and validate ``trace.json`` (or a report folder holding one)."""
    if str(path) == "":
        raise TraceFormatError("an empty path names no trace file")
    p = Path(path)
    if p.is_dir():
        p = p / "trace.json"
    return loads_trace(read_bytes(p), str(p))


def dumps_trace(trace: Trace) -> str:
    return json.dumps(trace_to_json(trace), indent=1, sort_keys=False) + "\n"
