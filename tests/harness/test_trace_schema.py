"""The trace schema (harness/traces/trace.py): a bad trace file is exit 2 with a message naming the file and
the JSON path of the bad field, never a traceback, a hang, a silent coercion, or code run.

Two parts: a table of bad inputs, each run through ``kvspec replay`` and ``kvspec report`` in process;
and a Hypothesis test that corrupts real traces (JSON-level and byte-level) and checks that the
loader either returns a ``Trace`` whose every value has its schema type (and which the report
renders) or raises ``TraceFormatError``, within a time bound.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.cli import main
from kvspec.harness.core import ops as O
from kvspec.harness.core.equality import RELATIONS
from kvspec.harness.core.ops import OP_TYPES
from kvspec.harness.core.ops_json import op_from_json, op_to_json
from kvspec.harness.core.strict_json import MAX_NUM_BLOCKS, MAX_TOKENS, TraceFormatError
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces.replay import replay
from kvspec.harness.traces.report import render_report
from kvspec.harness.traces.trace import MAX_BLOCK_STEPS, Trace, dumps_trace, loads_trace, read_trace, trace_to_json
from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import AttentionSpec, KVCacheConfig, full_attention, sliding_window
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import RequestStatus

CORPUS = sorted((Path(__file__).parents[1] / "corpus").glob("*.json"))
SWA = next(p for p in CORPUS if p.stem == "swa_skip_n_minus_w")  # one sliding-window group, 8 steps


def _base() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(SWA.read_text())
    return d


def _edit(fn: Callable[[dict[str, Any]], Any]) -> Callable[[], bytes]:
    """A bad input: the base trace changed by ``fn``."""

    def make() -> bytes:
        d = _base()
        fn(d)
        return json.dumps(d).encode()

    return make


def _raw(text: str | bytes) -> Callable[[], bytes]:
    return lambda: text if isinstance(text, bytes) else text.encode()


def _text_edit(old: str, new: str) -> Callable[[], bytes]:
    """A bad input made on the JSON text (what ``json.dumps`` cannot write: NaN, a field twice)."""

    def make() -> bytes:
        text = json.dumps(_base())
        assert old in text
        return text.replace(old, new, 1).encode()

    return make


def _nested(depth: int) -> Any:
    v: Any = 0
    for _ in range(depth):
        v = [v]
    return v


def _chunked(d: dict[str, Any]) -> None:
    d["config"]["groups"][0] = {"kind": "chunked_local", "block_size": 1, "attention_chunk_size": "4"}


def _add_step(step: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["steps"].append(step)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set the field at ``path`` (``a.b.0.c``: list indexes as numbers)."""

    def fn(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        obj: Any = d
        for p in parents:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        obj[int(last) if isinstance(obj, list) else last] = value

    return fn


BOTH, REPLAY = ("replay", "report"), ("replay",)
STEP0 = "steps.0"  # add_request "r1" of the base trace
# (description, the bad file's bytes, what the message says (with the JSON path), commands).
BAD_INPUTS: list[tuple[str, Callable[[], bytes], str, tuple[str, ...]]] = [
    ("non-UTF-8 bytes", _raw(b'{"kvspec_trace": 1, "x": "\xff\xfe"}'), "not UTF-8 text", BOTH),
    ("random bytes", _raw(random.Random(1).randbytes(300)), "not UTF-8 text", BOTH),
    ("an empty file", _raw(b""), "not valid JSON (truncated?)", BOTH),
    ("a truncated file", lambda: json.dumps(_base()).encode()[:150], "not valid JSON (truncated?)", BOTH),
    ("a JSON list at the top", _raw("[1, 2]"), "expected a JSON object at the top level", BOTH),
    (
        "deeply nested JSON (RecursionError)",
        _raw('{"kvspec_trace": 1, "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        "JSON nested too deeply",
        BOTH,
    ),
    ("nesting over the depth bound", _edit(_set("extra", {"a": _nested(100)})), "extra.a", BOTH),
    ("a file over the size bound", _raw(b" " * (16 << 20) + b"{}"), "larger than 16777216 bytes", BOTH),
    ("an int of 5000 digits", _text_edit('"num_blocks": 3', '"num_blocks": ' + "9" * 5000), "too long to read", BOTH),
    ("a field twice", _text_edit('"num_blocks": 3', '"num_blocks": 3, "num_blocks": 4'), "'num_blocks' twice", BOTH),
    ("NaN", _text_edit('"watermark": 0.0', '"watermark": NaN'), "config.watermark: expected a number", BOTH),
    ("Infinity", _edit(_set("extra", {"x": math.inf})), "extra.x: expected a finite number", BOTH),
    ("a lone surrogate", _text_edit('"request_id": "r1"', '"request_id": "\\ud800"'), "steps[0].request_id", BOTH),
    ("version 2", _edit(_set("kvspec_trace", 2)), "kvspec_trace: unsupported trace version 2", BOTH),
    ("version 1.0 (float is not int)", _edit(_set("kvspec_trace", 1.0)), "unsupported trace version 1.0", BOTH),
    ("version true (bool is not int)", _edit(_set("kvspec_trace", True)), "unsupported trace version true", BOTH),
    ("an unknown top-level field", _edit(_set("bogus", 1)), "unknown top-level field(s) 'bogus'", BOTH),
    (
        "hash_block_size_override 0 (ZeroDivisionError)",
        _edit(_set("config.hash_block_size_override", 0)),
        "config.hash_block_size_override: expected an int >= 1",
        BOTH,
    ),
    (
        "sliding_window as a string (TypeError)",
        _edit(_set("config.groups.0.sliding_window", "3")),
        "config.groups[0].sliding_window: expected an int >= 1",
        BOTH,
    ),
    (
        "sliding_window 2.5 (silently truncated before)",
        _edit(_set("config.groups.0.sliding_window", 2.5)),
        "config.groups[0].sliding_window: expected an int >= 1 and <= 1048576, got 2.5",
        BOTH,
    ),
    (
        "attention_chunk_size as a string (TypeError)",
        _edit(_chunked),
        "config.groups[0].attention_chunk_size: expected an int",
        BOTH,
    ),
    (
        "block_size 0",
        _edit(_set("config.groups.0.block_size", 0)),
        "config.groups[0].block_size: expected an int",
        BOTH,
    ),
    ("an unknown attention kind", _edit(_set("config.groups.0.kind", "mystery")), "unknown attention kind", BOTH),
    (
        "num_blocks 10**18 (MemoryError)",
        _edit(_set("config.num_blocks", 10**18)),
        "config.num_blocks: expected an int >= 1 and <= 1048576",
        BOTH,
    ),
    (
        "num_blocks 10**7 (a 30 s hang)",
        _edit(_set("config.num_blocks", 10**7)),
        "config.num_blocks: expected an int >= 1 and <= 1048576",
        BOTH,
    ),
    ("num_blocks as a string", _edit(_set("config.num_blocks", "many")), "config.num_blocks: expected an int", BOTH),
    ("max_model_len 10**9", _edit(_set("config.max_model_len", 10**9)), "config.max_model_len: expected an int", BOTH),
    (
        "enable_caching 1",
        _edit(_set("config.enable_caching", 1)),
        "config.enable_caching: expected true or false",
        BOTH,
    ),
    ("an unknown relation (ValueError)", _edit(_set("relation", "fuzzy")), "relation: unknown relation 'fuzzy'", BOTH),
    ("target not an object", _edit(_set("target", "spec")), "target: expected an object", BOTH),
    ("target name not a string", _edit(_set("target.name", 7)), "target.name: expected a non-empty string", BOTH),
    ("seed 1.5", _edit(_set("seed", 1.5)), "seed: expected an int", BOTH),
    (
        "too many steps",
        _edit(_set("steps", [{"op": "free", "request_id": "r1", "outcome": None}] * 10_001)),
        "steps: expected a list of at most 10000",
        BOTH,
    ),
    (
        "a pool at the bound with 17 steps (an 18 s replay)",
        _edit(lambda d: (_set("config.num_blocks", 2**20)(d), d["steps"].extend([d["steps"][-1]] * 9))),
        "steps: 17 steps on 1048576 blocks: num_blocks x steps must be <= 16777216",
        BOTH,
    ),
    ("an unknown operation", _edit(_set("steps.1.op", "teleport")), "steps[1]: unknown operation 'teleport'", BOTH),
    (
        "a step without outcome",
        _edit(lambda d: d["steps"][1].pop("outcome")),
        "steps[1]: missing field 'outcome'",
        BOTH,
    ),
    (
        "request_id an int",
        _edit(_set(f"{STEP0}.request_id", 5)),
        "steps[0].request_id: expected a non-empty string",
        BOTH,
    ),
    (
        "a negative token id",
        _edit(_set(f"{STEP0}.prompt_token_ids", [-1])),
        "steps[0].prompt_token_ids[0]: expected an int >= 0",
        BOTH,
    ),
    (
        "a token id true",
        _edit(_set(f"{STEP0}.prompt_token_ids", [True])),
        "steps[0].prompt_token_ids[0]: expected an int",
        BOTH,
    ),
    (
        "a token list as a string",
        _edit(_set(f"{STEP0}.prompt_token_ids", "abc")),
        "steps[0].prompt_token_ids: expected a list",
        BOTH,
    ),
    (
        "a LoRA name 'ab' (split into characters before)",
        _edit(_set(f"{STEP0}.lora", "ab")),
        "steps[0].lora: expected null or [lora_name, lora_path] (two strings), got 'ab'",
        BOTH,
    ),
    (
        "a multimodal offset 1.7 (read as 1 before)",
        _edit(_set(f"{STEP0}.mm_features", [{"identifier": "img", "offset": 1.7, "length": 1}])),
        "steps[0].mm_features[0].offset: expected an int >= 0",
        BOTH,
    ),
    (
        "a multimodal item with an unknown field",
        _edit(_set(f"{STEP0}.mm_features", [{"identifier": "img", "offset": 0, "length": 1, "x": 0}])),
        "steps[0].mm_features[0]: unknown field(s) 'x'",
        BOTH,
    ),
    (
        "skip_reading_prefix_cache 1",
        _edit(_set(f"{STEP0}.skip_reading_prefix_cache", 1)),
        "steps[0].skip_reading_prefix_cache: expected true or false, got 1",
        BOTH,
    ),
    ("an unknown status", _edit(_set("steps.3.status", "DONE")), "steps[3].status: expected one of", BOTH),
    (
        "a hit length as a string",
        _edit(_set("steps.1.outcome.num_hit_tokens", "0")),
        "steps[1].outcome.num_hit_tokens: expected an int",
        BOTH,
    ),
    (
        "reset_prefix_cache outcome 1 (True == 1 before)",
        _edit(_add_step({"op": "reset_prefix_cache", "outcome": 1})),
        "steps[8].outcome: expected a bool, got 1",
        BOTH,
    ),
    (
        "an outcome on an operation without one",
        _edit(_add_step({"op": "free", "request_id": "r1", "outcome": {"block_ids": [[1]]}})),
        "steps[8].outcome: expected None (the operation has no outcome)",
        BOTH,
    ),
    (
        "finding.kind a list",
        _edit(_set("finding.kind", ["divergence"])),
        "finding.kind: expected a non-empty string",
        BOTH,
    ),
    ("finding.step a string", _edit(_set("finding.step", "3")), "finding.step: expected an int >= 0 and <= 7", BOTH),
    (
        "finding.step past the steps",
        _edit(_set("finding.step", 8)),
        "finding.step: expected an int >= 0 and <= 7",
        BOTH,
    ),
    ("finding.step true", _edit(_set("finding.step", True)), "finding.step: expected an int", BOTH),
    ("finding.message an int", _edit(_set("finding.message", 3)), "finding.message: expected a string", BOTH),
    ("finding without kind", _edit(lambda d: d["finding"].pop("kind")), "finding: missing field 'kind'", BOTH),
    ("finding.op unknown", _edit(_set("finding.op", {"op": "teleport"})), "finding.op: unknown operation", BOTH),
    ("finding.traceback a list", _edit(_set("finding.traceback", ["x"])), "finding.traceback: expected a string", BOTH),
    (
        "a witness ref_cnt as a string",
        _edit(
            _set(
                "finding.witness",
                {
                    "target_after": {
                        "tables": [{"r1": [1]}],
                        "num_cached_block": [{"r1": 0}],
                        "blocks": {"1": {"ref_cnt": "1", "hash": None, "free_pos": None}},
                        "free_queue": [2],
                        "num_hashes": {"r1": 0},
                    }
                },
            )
        ),
        'finding.witness.target_after.blocks["1"].ref_cnt: expected an int',
        BOTH,
    ),
    # A trace never chooses code to run (harness.run.catalogue.replay_target); ``report`` runs no target.
    ("target sys:exit (a silent exit 0 before)", _edit(_set("target.name", "sys:exit")), "target 'sys:exit'", REPLAY),
    ("target os:abort (killed replay before)", _edit(_set("target.name", "os:abort")), "target 'os:abort'", REPLAY),
]


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The modules ``importlib.import_module`` was asked for; ``sys`` and ``os`` are refused (and the
    call recorded, so a test sees it even if the caller swallows the error)."""
    calls: list[str] = []
    real = importlib.import_module

    def spy(name: str, package: str | None = None) -> Any:
        calls.append(name)
        if name in ("sys", "os"):
            raise AssertionError(f"importlib.import_module({name!r}) called for a trace's target")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", spy)
    return calls


@pytest.mark.parametrize("make, says, commands", [row[1:] for row in BAD_INPUTS], ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_exit_2_naming_the_field(
    make: Callable[[], bytes],
    says: str,
    commands: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    imports: list[str],
) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(make())
    for command in commands:
        t0 = time.monotonic()
        rc = main([command, str(path)])
        elapsed = time.monotonic() - t0
        out, err = capsys.readouterr()
        assert rc == 2, f"{command}: exit {rc}\n{out}\n{err}"
        assert says in err and str(path) in err, err
        assert "Traceback" not in out + err
        assert elapsed < 10, f"{command} took {elapsed:.1f}s"
    assert not {"sys", "os"} & set(imports), imports


def test_the_table_covers_every_case_of_the_issue() -> None:
    """Each loader crash, hang and coercion the issue lists has a row (descriptions name them)."""
    names = " ".join(row[0] for row in BAD_INPUTS)
    for case in (
        "UTF-8", "random bytes", "RecursionError", "ZeroDivisionError", "TypeError", "ValueError", "MemoryError",
        "hang", "2.5", "1.0", "true", "LoRA", "offset 1.7", "kind a list", "step a string", "sys:exit", "os:abort",
    ):  # fmt: skip
        assert case in names, case


def test_messages_name_the_file_and_the_json_path(tmp_path: Path) -> None:
    d = _base()
    d["config"]["groups"][0]["sliding_window"] = 2.5
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TraceFormatError) as e:
        read_trace(path)
    assert str(e.value) == f"{path}: config.groups[0].sliding_window: expected an int >= 1 and <= 1048576, got 2.5"


def test_the_corpus_still_loads_and_round_trips() -> None:
    for path in CORPUS:
        trace = read_trace(path)
        _check_types(trace)
        back = loads_trace(dumps_trace(trace))
        assert trace_to_json(back) == trace_to_json(trace)
        assert json.loads(path.read_text())["steps"][1]["outcome"] == trace.steps[1][1]


def test_num_blocks_at_the_bound_loads_and_resets_fast(tmp_path: Path) -> None:
    """The bound on num_blocks (2**20) keeps SpecTarget.reset (what replay and report do first) short;
    the 8 steps of the base trace are within the replay-work bound (num_blocks x steps <= 2**24)."""
    d = _base()
    d["config"]["num_blocks"] = MAX_NUM_BLOCKS
    trace = loads_trace(json.dumps(d))
    assert len(trace.steps) * trace.config.num_blocks <= MAX_BLOCK_STEPS
    t0 = time.monotonic()
    SpecTarget().reset(trace.config)
    assert time.monotonic() - t0 < 5


def test_every_operation_field_has_a_parser() -> None:
    """Each field of each operation reads back from its JSON form (``_parse_field`` covers them all)."""
    ops = [
        O.AddRequest(
            "r1", (1, 2), ("sql", "/p"), (O.MMFeatureSpec("img", 0, 1),), "salt", True, ("00000000", "00000000")
        ),
        O.AddRequest("r2", (1, 2), prompt_logprob_start=1),
        O.AppendOutputTokens("r1", (3,)),
        O.SetSpecTokens("r1", (4,)),
        O.SetNumComputedTokens("r1", 2),
        O.SetNumInFlightTokens("r1", 1),
        O.SetStatus("r1", "RUNNING"),
        O.GetComputedBlocks("r1"),
        O.AllocateSlots("r1", 1, 1, True, 1, 1, True, 1, True, 1, False),
        O.Free("r1"),
        O.CacheBlocks("r1", 1),
        O.RemoveSkippedBlocks("r1", 1),
        O.EvictBlocks((1, 2)),
        O.ResetPrefixCache(),
        O.TakeEvents(),
    ]
    assert {op.op for op in ops} == set(OP_TYPES)
    for op in ops:
        assert op_from_json(op_to_json(op)) == op


# --- Hypothesis: corrupted real traces --------------------------------------------------------------


@functools.cache
def _seeds() -> tuple[str, ...]:
    """Real traces to corrupt: the corpus; two corpus traces with the full finding their deliberate
    bug gives (witness, op, outcomes); and a workload trace with events, drafts, embeddings."""
    texts = [p.read_text() for p in CORPUS]
    for path in CORPUS[:2]:
        trace = read_trace(path)
        result = replay(trace, resolve(f"mutant:{path.stem}").factory)
        assert result.finding is not None
        trace.finding = result.finding.to_json()
        texts.append(dumps_trace(trace))
    config = KVCacheConfig(13, (full_attention(2), sliding_window(2, 3)), 12, enable_kv_cache_events=True)
    steps: list[tuple[O.Op, Any]] = []
    run_seeded(
        SpecTarget(),
        config,
        5,
        12,
        on_op=lambda op, out: steps.append((op, out)),
        features=frozenset({"prompt_embeds", "async_scheduling"}),
    )
    finding = {"kind": "invariant", "step": len(steps) - 1, "message": "m", "claim": "c", "model": {"T": 3}}
    texts.append(dumps_trace(Trace(config, steps, "spec", "x", seed=5, family="events", finding=finding)))
    return tuple(texts)


BIG = [0, -1, 1, 2, 3, 7, 2**20, 2**20 + 1, 2**31, 2**63, -(2**63), 10**7, 10**18, 10**400]
SPECIAL: list[Any] = [None, True, False, 0.0, 0.5, 1.0, 1.7, 2.5, -0.0, 1e308, math.nan, math.inf, -math.inf]
SPECIAL += ["", "x", "ab", "spec", "sys:exit", "mutant:nope", "\ud800", "RUNNING", "full", "exact", "9" * 300]
SPECIAL += [[], {}, [1], [[1]], {"op": "free"}, {"block_ids": [[1]]}, [0] * 50, {"kind": 1}]


def _paths(obj: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value below ``obj``."""
    out: list[tuple[Any, Any]] = []
    stack = [obj]
    while stack:
        c = stack.pop()
        items = list(c.items()) if isinstance(c, dict) else list(enumerate(c)) if isinstance(c, list) else []
        for k, v in items:
            out.append((c, k))
            stack.append(v)
    return out


def _swapped(draw: st.DrawFn, old: Any) -> Any:
    """``old`` in another JSON type, or a huge, negative, special or deeply nested value."""
    how = draw(st.sampled_from(["float", "str", "bool", "list", "dict", "none", "big", "special", "nest", "int"]))
    if how == "float":
        return float(old) if type(old) is int and abs(old) < 2**1000 else 0.5
    if how == "str":
        return str(old)[:50]
    if how == "bool":
        return bool(old)
    if how == "list":
        return [old]
    if how == "dict":
        return {"x": old}
    if how == "none":
        return None
    if how == "big":
        return draw(st.sampled_from(BIG)) * draw(st.sampled_from([1, -1]))
    if how == "nest":
        v = old
        for _ in range(draw(st.integers(1, 100))):
            v = [v]
        return v
    if how == "int":
        return draw(st.integers())
    return copy.deepcopy(draw(st.sampled_from(SPECIAL)))


def _mutate_json(draw: st.DrawFn, rng: random.Random, obj: dict[str, Any]) -> None:
    """Delete, replace, duplicate or retype the value at one random JSON path (chosen uniformly)."""
    c, k = rng.choice(_paths(obj))
    how = draw(st.sampled_from(["delete", "replace", "duplicate", "add"]))
    if how == "delete":
        del c[k]
    elif how == "duplicate" and isinstance(c, list):
        c.insert(k, copy.deepcopy(c[k]))
    elif how == "add" and isinstance(c, dict):
        c[draw(st.sampled_from(["x", "outcome", "op", "kind", "step", "version", "lora", *c]))] = copy.deepcopy(c[k])
    else:
        c[k] = _swapped(draw, c[k])


def _mutate_bytes(draw: st.DrawFn, rng: random.Random, data: bytes) -> bytes:
    """Truncate, flip bits, splice random bytes, insert a long number or deep nesting, or replace all."""
    how = draw(st.sampled_from(["truncate", "flip", "splice", "digits", "nest", "random"]))
    at = rng.randrange(len(data) + 1)
    if how == "truncate":
        return data[:at]
    if how == "flip":
        b = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if how == "splice":
        return data[:at] + draw(st.binary(min_size=1, max_size=20)) + data[at + draw(st.integers(0, 20)) :]
    if how == "digits":
        return data[:at] + b"9" * draw(st.sampled_from([30, 400, 5000])) + data[at:]
    if how == "nest":
        n = draw(st.sampled_from([70, 2000, 50_000]))
        return data[:at] + b"[" * n + b"]" * n + data[at:]
    return draw(st.binary(max_size=200))


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    text = draw(st.sampled_from(_seeds()))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))  # positions: uniform over the file, not early first
    if draw(st.integers(0, 3)) == 0:
        return _mutate_bytes(draw, rng, text.encode())
    obj = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        _mutate_json(draw, rng, obj)
    return json.dumps(obj).encode("utf-8", "surrogatepass")


CASE_SECONDS = 10.0  # a hang bound, not a timing test: a case normally takes milliseconds
SEEN: set[bytes] = set()


@settings(
    max_examples=1500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(corrupted())
def _check_corrupted(data: bytes) -> None:
    SEEN.add(data)
    t0 = time.monotonic()
    try:
        trace = loads_trace(data, "corrupted.json")
    except TraceFormatError as e:
        assert str(e).startswith("corrupted.json: ") and len(str(e)) > len("corrupted.json: ") + 5
    else:
        _check_types(trace)
        assert render_report(trace)
        if trace.config.num_blocks <= 4096:
            replay(trace, SpecTarget, CheckSettings(step_timeout=None))  # a result, never an exception
    assert time.monotonic() - t0 < CASE_SECONDS


def test_corrupted_traces_load_or_are_refused() -> None:
    """Every corrupted trace loads with exact types (and renders and replays) or is a TraceFormatError;
    nothing else is raised, and no case hangs."""
    SEEN.clear()
    _check_corrupted()
    assert len(SEEN) >= 400, len(SEEN)


# --- the exact types of a loaded trace (an oracle written apart from the loader) ---------------------


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_opt(v: Any, pred: Callable[[Any], bool]) -> bool:
    return v is None or pred(v)


def _is_json(v: Any, depth: int = 0) -> bool:
    if depth > 70:
        return False
    if type(v) is dict:
        return all(type(k) is str and _is_json(x, depth + 1) for k, x in v.items())
    if type(v) is list:
        return all(_is_json(x, depth + 1) for x in v)
    if type(v) is float:
        return math.isfinite(v)
    return v is None or type(v) in (bool, int, str)


def _is_table(v: Any) -> bool:
    return type(v) is list and all(type(g) is list and all(_is_int(b) for b in g) for g in v)


def _check_outcome(op: O.Op, out: Any) -> None:
    if out is None:
        return
    if isinstance(op, O.GetComputedBlocks):
        assert set(out) == {"block_ids", "num_hit_tokens"} and _is_table(out["block_ids"]), out
        assert _is_int(out["num_hit_tokens"])
    elif isinstance(op, O.AllocateSlots):
        assert set(out) == {"block_ids"} and _is_table(out["block_ids"]), out
    elif isinstance(op, O.ResetPrefixCache):
        assert type(out) is bool
    elif isinstance(op, O.TakeEvents):
        assert type(out) is list and all(type(e) is dict and type(e["type"]) is str for e in out)
        assert _is_json(out)
    else:
        raise AssertionError(f"{op.op} has outcome {out!r}")


FIELD_TYPES: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "bool": lambda v: type(v) is bool,
    "str": lambda v: type(v) is str,
    "tuple[int, ...]": lambda v: type(v) is tuple and all(_is_int(t) for t in v),
    "tuple[str, str] | None": lambda v: _is_opt(v, lambda x: type(x) is tuple and [type(s) for s in x] == [str, str]),
    "tuple[MMFeatureSpec, ...]": lambda v: (
        type(v) is tuple
        and all(
            type(m) is O.MMFeatureSpec and type(m.identifier) is str and _is_int(m.offset) and _is_int(m.length)
            for m in v
        )
    ),
    "str | None": lambda v: _is_opt(v, lambda x: type(x) is str),
    "int | None": lambda v: _is_opt(v, _is_int),
    "tuple[str, ...] | None": lambda v: _is_opt(v, lambda x: type(x) is tuple and all(type(r) is str for r in x)),
}


def _check_op(op: O.Op) -> None:
    assert type(op) in OP_TYPES.values()
    for f in op.__dataclass_fields__.values():
        assert FIELD_TYPES[str(f.type)](getattr(op, f.name)), (op.op, f.name, getattr(op, f.name))
    if isinstance(op, O.SetStatus):
        assert op.status in {s.value for s in RequestStatus}


def _check_config(c: KVCacheConfig) -> None:
    assert type(c) is KVCacheConfig and _is_int(c.num_blocks) and _is_int(c.max_model_len)
    assert 1 <= c.num_blocks <= MAX_NUM_BLOCKS and 1 <= c.max_model_len <= MAX_TOKENS
    assert type(c.groups) is tuple and c.groups
    for g in c.groups:
        assert type(g) is AttentionSpec and type(g.kind) is str and _is_int(g.block_size)
        assert _is_opt(g.sliding_window, _is_int) and _is_opt(g.attention_chunk_size, _is_int)
    assert type(c.enable_caching) is bool and type(c.enable_kv_cache_events) is bool and type(c.hash_algo) is str
    assert type(c.watermark) is float and type(c.profile) is Profile
    assert _is_opt(c.max_in_flight_tokens, _is_int) and _is_opt(c.hash_block_size_override, _is_int)


def _check_finding(f: dict[str, Any] | None, num_steps: int) -> None:
    if f is None:
        return
    assert type(f) is dict and type(f["kind"]) is str and type(f["message"]) is str
    assert f["step"] is None or (_is_int(f["step"]) and 0 <= f["step"] < num_steps)
    text = {"invariant", "traceback", "kv_markdown"}
    for k in text & set(f):
        assert _is_opt(f[k], lambda x: type(x) is str), k
    if f.get("op") is not None:
        assert type(f["op"]["op"]) is str
    assert type(f.get("blocks", [])) is list and all(_is_int(b) for b in f.get("blocks", []))
    assert type(f.get("requests", [])) is list and all(type(r) is str for r in f.get("requests", []))
    assert type(f.get("witness", {})) is dict and _is_opt(f.get("kv"), lambda x: type(x) is dict)
    assert _is_json(f)


def _check_types(trace: Trace) -> None:
    _check_config(trace.config)
    assert type(trace.steps) is list
    for op, out in trace.steps:
        _check_op(op)
        _check_outcome(op, out)
    assert type(trace.target_name) is str and trace.target_name and type(trace.target_version) is str
    assert _is_opt(trace.seed, _is_int) and _is_opt(trace.profile, lambda x: type(x) is str)
    assert _is_opt(trace.family, lambda x: type(x) is str) and trace.relation in RELATIONS
    assert type(trace.extra) is dict and _is_json(trace.extra)
    _check_finding(trace.finding, len(trace.steps))
