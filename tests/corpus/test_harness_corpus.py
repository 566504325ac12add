"""The regression corpus: each trace is a shrunk finding of one deliberate bug (named by its file).

Recorded outcomes are checked, not only recorded: every trace must replay as recorded, in exact
lockstep with the spec, on three independent readings of vLLM 0.33 (the spec, kvspec's ``impl``
allocator, and the real vLLM ``KVCacheManager``); and the deliberate bug it was found with must
still fail on it, so a corpus entry that stopped catching its bug is reported.
"""

import json
from pathlib import Path

import pytest

from kvspec.harness.cli import main
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.traces.replay import replay
from kvspec.harness.traces.trace import read_trace

CORPUS = sorted(Path(__file__).parent.glob("*.json"))
TARGETS = [
    "spec",
    "impl",
    pytest.param("vllm", marks=pytest.mark.vllm),
]


def test_corpus_is_not_empty():
    assert CORPUS


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_trace_replays_as_recorded(path, target):
    result = replay(read_trace(path), resolve(target).factory)
    assert result.ok, f"{target}: {result.message}"


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_the_bug_it_was_found_with_still_fails(path):
    result = replay(read_trace(path), resolve(f"mutant:{path.stem}").factory)
    assert not result.ok, f"mutant:{path.stem} replays {path.name} cleanly: the entry lost its teeth"


def test_cli_replays_the_folder_on_vllm():
    pytest.importorskip("vllm")
    assert main(["replay", "--target", "vllm", str(Path(__file__).parent)]) == 0


def test_a_changed_outcome_is_reported(tmp_path):
    """Teeth: flip one recorded outcome and the replay must fail with exit 1."""
    for path in CORPUS:
        d = json.loads(path.read_text())
        lookups = [s for s in d["steps"] if s["op"] == "get_computed_blocks"]
        if lookups:
            lookups[0]["outcome"]["num_hit_tokens"] += 1
            break
    else:
        pytest.fail("no trace of the corpus has a prefix-cache lookup")
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    assert main(["replay", str(p)]) == 1
