"""The committed regression corpus replays on the spec exactly as recorded (``kvspec replay``)."""

from pathlib import Path

import pytest

from harness.cli import main
from harness.replay import replay
from harness.targets.spec import SpecTarget
from harness.trace import read_trace

CORPUS = sorted(Path(__file__).parent.glob("*.json"))


def test_corpus_is_not_empty():
    assert CORPUS


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_trace_replays_as_recorded(path):
    result = replay(read_trace(path), SpecTarget)
    assert result.ok, result.message


def test_cli_replays_the_folder():
    assert main(["replay", str(Path(__file__).parent)]) == 0


@pytest.mark.parametrize("path", CORPUS[:1])
def test_a_changed_outcome_is_reported(path, tmp_path):
    """Teeth: flip one recorded outcome and the replay must fail with exit 1."""
    import json

    d = json.loads(path.read_text())
    for s in d["steps"]:
        if s["op"] == "get_computed_blocks":
            s["outcome"]["num_hit_tokens"] += 1
            break
    else:
        pytest.skip("no lookup in this trace")
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    assert main(["replay", str(p)]) == 1
