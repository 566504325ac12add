"""The trace format as a published JSON Schema (docs/trace.schema.json, harness/traces/json_schema.py),
checked against the reader kvspec replays with: every trace kvspec writes is valid under both, and a
mutated trace is refused by both or accepted by both, but where the schema's docstring says JSON
Schema cannot express the reader's rule (the rules across fields)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvspec.harness.traces.json_schema import SCHEMA_PATH, render_schema
from kvspec.harness.traces.trace import trace_from_json

ROOT = Path(__file__).resolve().parents[2]
CORPUS = sorted((ROOT / "tests" / "corpus").glob("*.json"))
VALUES = (None, "x", -1, True, 1.5, [], {}, 0, 10**9)
CROSS_FIELD = {
    ("config", "groups", "#", "sliding_window"),  # KVCacheConfig.validate: a window group needs its window
    ("steps", "#", "outcome", "block_ids", "#", "#"),  # a reported block id within the trace's pool
}
"""Where only the reader can refuse (the schema's docstring lists them), as paths with ``#`` for an index."""


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def reader_accepts(obj: Any) -> bool:
    try:
        trace_from_json(obj)
    except Exception:  # noqa: BLE001 - any refusal counts
        return False
    return True


def test_the_published_schema_is_the_generated_one_and_a_valid_schema():
    assert SCHEMA_PATH.read_text() == render_schema(), "run: python -m kvspec.harness.traces.json_schema --write"
    jsonschema.Draft202012Validator.check_schema(schema())


def test_check_jsonschema_validates_a_corpus_trace_and_refuses_a_broken_one(tmp_path):
    cli = [sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMA_PATH)]
    ok = subprocess.run([*cli, str(CORPUS[0])], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = json.loads(CORPUS[0].read_text())
    broken["steps"][0]["op"] = "allocate_everything"
    (tmp_path / "t.json").write_text(json.dumps(broken))
    bad = subprocess.run([*cli, str(tmp_path / "t.json")], capture_output=True, text=True)
    assert bad.returncode == 1 and "steps" in bad.stdout + bad.stderr


def test_every_trace_kvspec_wrote_here_is_valid(tmp_path):
    from kvspec.harness.cli import main

    assert main(["fuzz", "--target", "mutant:hit_cap_num_tokens", "--seconds", "20", "--out", str(tmp_path)]) == 1
    traces = [*CORPUS, *tmp_path.glob("*/trace.json")]
    assert len(traces) > len(CORPUS)
    v = validator()
    for path in traces:
        obj = json.loads(path.read_text())
        assert reader_accepts(obj), path
        assert not list(v.iter_errors(obj)), (path, next(v.iter_errors(obj)).message)


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to the scalar and empty values of ``obj`` (the first 5 items of a list)."""
    if isinstance(obj, dict) and obj:
        return [p for k, x in obj.items() for p in leaves(x, (*path, k))]
    if isinstance(obj, list) and obj:
        return [p for i, x in enumerate(obj[:5]) for p in leaves(x, (*path, i))]
    return [path]


def changed(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(obj)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    "path", [CORPUS[0], *(pytest.param(p, marks=pytest.mark.full) for p in CORPUS[1:3])], ids=lambda p: p.stem
)
def test_schema_and_reader_agree_on_every_single_value_change(path):
    """Each value of the trace (all steps' fields, the config, the target, the finding) replaced by
    each of ``VALUES``: both accept or both refuse, but on ``CROSS_FIELD`` paths."""
    obj, v = json.loads(path.read_text()), validator()
    disagree = []
    for where in leaves(obj):
        shape = tuple(p if isinstance(p, str) else "#" for p in where)
        for value in VALUES:
            mutated = changed(obj, where, value)
            if (not list(v.iter_errors(mutated))) != reader_accepts(mutated) and shape not in CROSS_FIELD:
                disagree.append((where, value))
    assert not disagree, disagree[:10]


def test_schema_and_reader_agree_on_fields_added_and_removed():
    obj, v = json.loads(CORPUS[0].read_text()), validator()
    cases = {
        "an unknown top-level field": {**obj, "bogus": 1},
        "no config": {k: x for k, x in obj.items() if k != "config"},
        "another version": {**obj, "kvspec_trace": 2},
        "an unknown relation": {**obj, "relation": "roughly"},
        "an unknown config field": {**obj, "config": {**obj["config"], "bogus": 1}},
        "a step without its outcome": {**obj, "steps": [{k: x for k, x in obj["steps"][0].items() if k != "outcome"}]},
        "a step with an unknown field": {**obj, "steps": [{**obj["steps"][0], "bogus": 1}]},
        "a target without a name": {**obj, "target": {}},
        "a finding without its kind": {**obj, "finding": {"step": None, "message": "m"}},
    }
    for name, mutated in cases.items():
        assert list(v.iter_errors(mutated)) and not reader_accepts(mutated), name
    fine = {
        **obj,
        "seed": None,
        "family": "mine",
        "extra": {"a": [1]},
        "finding": {"kind": "k", "step": None, "message": ""},
    }
    assert not list(v.iter_errors(fine)) and reader_accepts(fine)
