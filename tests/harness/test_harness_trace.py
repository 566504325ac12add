"""Trace files: round trip, and precise errors (exit 2) for bad files."""

import json

import pytest

from kvspec.harness.cli import main
from kvspec.harness.core import ops as O
from kvspec.harness.core.strict_json import TraceFormatError
from kvspec.harness.traces.trace import Trace, dumps_trace, read_trace, trace_from_json, trace_to_json
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window


def _trace() -> Trace:
    config = KVCacheConfig(9, (full_attention(4), sliding_window(4, 5)), 32, enable_kv_cache_events=True)
    steps = [
        (
            O.AddRequest(
                "r1", (1, 2, 3, 4, 5), lora=("sql", "/l"), mm_features=(O.MMFeatureSpec("img", 1, 2),), cache_salt="s"
            ),
            None,
        ),
        (O.GetComputedBlocks("r1"), {"block_ids": [[], []], "num_hit_tokens": 0}),
        (O.AllocateSlots("r1", 5, use_computed_blocks=True, num_lookahead_tokens=2), {"block_ids": [[1, 2], [3, 4]]}),
        (O.EvictBlocks((1, 3)), None),
        (O.ResetPrefixCache(), False),
    ]
    return Trace(
        config,
        steps,
        "spec",
        "kvspec 0.1.0",
        seed=7,
        profile="ci",
        family="hybrid_equal",
        finding={"kind": "x", "step": 1, "message": "m"},
    )


def test_round_trip_preserves_everything(tmp_path):
    t = _trace()
    p = tmp_path / "trace.json"
    p.write_text(dumps_trace(t))
    back = read_trace(p)
    assert back.config == t.config
    assert back.steps == t.steps
    assert (back.seed, back.profile, back.family, back.finding) == (7, "ci", "hybrid_equal", t.finding)
    assert trace_to_json(back) == trace_to_json(t)


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d.update(kvspec_trace=2), "unsupported trace version 2"),
        (lambda d: d.pop("kvspec_trace"), "not a kvspec trace"),
        (lambda d: d["steps"][1].update(op="teleport"), "steps[1]: unknown operation 'teleport'"),
        (lambda d: d["steps"][2].pop("num_new_tokens"), "steps[2]: 'allocate_slots' is missing field 'num_new_tokens'"),
        (lambda d: d["steps"][2].pop("outcome"), "steps[2]: missing field 'outcome'"),
        (lambda d: d["config"].update(num_blocks="many"), "config.num_blocks: expected an int"),
        (lambda d: d["config"]["groups"][1].update(kind="mystery"), "unknown attention kind"),
        (lambda d: d.pop("steps"), "missing field 'steps'"),
    ],
)
def test_bad_trace_names_the_problem(mutate, needle):
    d = json.loads(dumps_trace(_trace()))
    mutate(d)
    with pytest.raises(TraceFormatError, match=None) as e:
        trace_from_json(d)
    assert needle in str(e.value)


def test_truncated_file_exits_2_with_a_message(tmp_path, capsys):
    p = tmp_path / "t.json"
    p.write_text(dumps_trace(_trace())[:200])
    assert main(["replay", str(p)]) == 2
    assert "not valid JSON (truncated?)" in capsys.readouterr().err
    assert main(["report", str(p)]) == 2


def test_unknown_operation_exits_2(tmp_path, capsys):
    d = json.loads(dumps_trace(_trace()))
    d["steps"][0]["op"] = "defragment"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    assert main(["replay", str(p)]) == 2
    assert "unknown operation 'defragment'" in capsys.readouterr().err
