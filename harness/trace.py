"""The trace file: a language-neutral, versioned record of one fuzzing run (``trace.json``).

Schema (version 1)::

    {"kvspec_trace": 1,
     "config":  {KVCacheConfig fields; groups as objects; profile as its string value},
     "seed": int | null, "profile": "dev" | "ci" | "nightly" | null,
     "family": str | null, "relation": "exact" | ...,
     "target": {"name": str, "version": str},
     "steps": [ {"op": ..., <operation fields>, "outcome": <JSON>} , ...],
     "finding": null | {"kind": str, "step": int | null, "message": str, ...}}

Each step's ``outcome`` is the expected outcome: the reference spec's (or, when the trace was
recorded without a reference, the target's).  Reading validates everything and raises
``TraceFormatError`` (from ``harness.ops``) naming the offending part, so a truncated file, an
unknown version or an unknown operation gives one precise message (the CLI turns it into exit 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.ops import Op, TraceFormatError, op_from_json, op_to_json
from spec.config import AttentionSpec, ConfigError, KVCacheConfig, Profile

TRACE_VERSION = 1


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
        "profile": config.profile.value,
        "hash_block_size_override": config.hash_block_size_override,
    }


_CONFIG_REQUIRED = ("num_blocks", "groups", "max_model_len")
_CONFIG_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "enable_caching": bool,
    "hash_algo": str,
    "enable_kv_cache_events": bool,
    "watermark": (int, float),
    "max_in_flight_tokens": (int, type(None)),
    "profile": str,
    "hash_block_size_override": (int, type(None)),
}


def config_from_json(obj: Any, where: str = "config") -> KVCacheConfig:
    """Parse and validate a config; raise ``TraceFormatError`` naming the bad field."""
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected an object, got {type(obj).__name__}")
    for name in _CONFIG_REQUIRED:
        if name not in obj:
            raise TraceFormatError(f"{where}: missing field {name!r}")
    unknown = set(obj) - set(_CONFIG_REQUIRED) - set(_CONFIG_OPTIONAL)
    if unknown:
        raise TraceFormatError(f"{where}: unknown field(s) {sorted(unknown)}")
    for name in ("num_blocks", "max_model_len"):
        if not isinstance(obj[name], int) or isinstance(obj[name], bool):
            raise TraceFormatError(f"{where}.{name}: expected an int, got {obj[name]!r}")
    for name, types in _CONFIG_OPTIONAL.items():
        if name in obj and (not isinstance(obj[name], types) or (types is not bool and isinstance(obj[name], bool))):
            raise TraceFormatError(f"{where}.{name}: unexpected value {obj[name]!r}")
    if not isinstance(obj["groups"], list):
        raise TraceFormatError(f"{where}.groups: expected a list")
    groups = []
    for i, g in enumerate(obj["groups"]):
        gw = f"{where}.groups[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("kind"), str) or not isinstance(g.get("block_size"), int):
            raise TraceFormatError(f"{gw}: expected an object with 'kind' (string) and 'block_size' (int)")
        extra = set(g) - {"kind", "block_size", "sliding_window", "attention_chunk_size"}
        if extra:
            raise TraceFormatError(f"{gw}: unknown field(s) {sorted(extra)}")
        groups.append(AttentionSpec(g["kind"], g["block_size"], g.get("sliding_window"), g.get("attention_chunk_size")))
    kwargs = {k: obj[k] for k in _CONFIG_OPTIONAL if k in obj}
    if "profile" in kwargs:
        try:
            kwargs["profile"] = Profile(kwargs["profile"])
        except ValueError:
            known = ", ".join(p.value for p in Profile)
            raise TraceFormatError(f"{where}.profile: unknown profile {obj['profile']!r} (known: {known})") from None
    try:
        config = KVCacheConfig(
            num_blocks=obj["num_blocks"], groups=tuple(groups), max_model_len=obj["max_model_len"], **kwargs
        )
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


def trace_from_json(obj: Any, where: str = "trace") -> Trace:
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object at the top level, got {type(obj).__name__}")
    if "kvspec_trace" not in obj:
        raise TraceFormatError(f"{where}: not a kvspec trace (no 'kvspec_trace' version field)")
    version = obj["kvspec_trace"]
    if version != TRACE_VERSION:
        raise TraceFormatError(
            f"{where}: unsupported trace version {version!r} (this kvspec reads version {TRACE_VERSION})"
        )
    known = {"kvspec_trace", "config", "seed", "profile", "family", "relation", "target", "steps", "finding", "extra"}
    unknown = set(obj) - known
    if unknown:
        raise TraceFormatError(f"{where}: unknown top-level field(s) {sorted(unknown)}")
    for name in ("config", "target", "steps"):
        if name not in obj:
            raise TraceFormatError(f"{where}: missing field {name!r}")
    config = config_from_json(obj["config"], f"{where}.config")
    target = obj["target"]
    if not isinstance(target, dict) or not isinstance(target.get("name"), str):
        raise TraceFormatError(f"{where}.target: expected {{'name': str, 'version': str}}")
    if not isinstance(obj["steps"], list):
        raise TraceFormatError(f"{where}.steps: expected a list")
    steps: list[tuple[Op, Any]] = []
    for i, s in enumerate(obj["steps"]):
        sw = f"{where}.steps[{i}]"
        op = op_from_json(s, sw)
        if "outcome" not in s:
            raise TraceFormatError(f"{sw}: missing field 'outcome'")
        steps.append((op, s["outcome"]))
    seed = obj.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TraceFormatError(f"{where}.seed: expected an int or null")
    finding = obj.get("finding")
    if finding is not None and not isinstance(finding, dict):
        raise TraceFormatError(f"{where}.finding: expected an object or null")
    relation = obj.get("relation", "exact")
    if not isinstance(relation, str):
        raise TraceFormatError(f"{where}.relation: expected a string")
    return Trace(
        config=config,
        steps=steps,
        target_name=target["name"],
        target_version=str(target.get("version", "")),
        seed=seed,
        profile=obj.get("profile"),
        family=obj.get("family"),
        relation=relation,
        finding=finding,
        extra=obj.get("extra") or {},
    )


def read_trace(path: str | Path) -> Trace:
    """Read and validate ``trace.json`` (or a report folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "trace.json"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{p}: not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    return trace_from_json(obj, str(p))


def dumps_trace(trace: Trace) -> str:
    return json.dumps(trace_to_json(trace), indent=1, sort_keys=False) + "\n"


def find_traces(paths: list[str]) -> list[Path]:
    """Expand folders into the ``trace.json`` / ``*.json`` trace files below them, sorted."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.json") if q.is_file())
            if not found:
                raise TraceFormatError(f"{p}: folder holds no trace files (*.json)")
            out.extend(found)
        else:
            out.append(p)
    return out
