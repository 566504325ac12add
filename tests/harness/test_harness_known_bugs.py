"""Known target bugs are data (harness/ledger/known_bugs.py): counted and reported once, never steering."""

import re
import subprocess
import sys

from kvspec.harness.cli import main
from kvspec.harness.ledger.known_bugs import KNOWN_BUGS, match_known_bug

WINDOW_LOAD = {
    "invariant": "kv_write_in_real_block",
    "group_kind": "sliding_window",
    "recompute": "full-remote-load",
    "chunk_multiple_of_block": None,
    "source": "computed",
    "release": "0.33.0",
}


def test_each_known_bug_has_its_reproduction_and_report():
    from pathlib import Path

    root = Path(__file__).parents[2]
    for bug in KNOWN_BUGS:
        assert (root / bug.reproduction).is_file() and (root / bug.report).is_file(), bug.id
        fix_file = bug.fix.split(": ", 1)[1].split(" ", 1)[0]  # "<layer>: <file> (<how>)"
        assert (root / fix_file).is_file(), (bug.id, bug.fix)


def test_matching_is_by_signature():
    assert match_known_bug(WINDOW_LOAD).name == "window_full_remote_load"
    assert match_known_bug({**WINDOW_LOAD, "recompute": "load-recovery"}).name == "window_invalid_block_recovery"
    # the same broken rule without the known trigger is an ordinary finding
    assert match_known_bug({**WINDOW_LOAD, "recompute": None}) is None
    assert match_known_bug({**WINDOW_LOAD, "invariant": "kv_read_own_kv"}) is None
    assert match_known_bug({**WINDOW_LOAD, "group_kind": "full"}) is None
    # ... unless the release it was found on has a known bug of that shape: K9 up to 0.25.1 only
    assert match_known_bug({**WINDOW_LOAD, "recompute": None, "release": "0.25.1"}).id == "K9"
    assert match_known_bug({**WINDOW_LOAD, "recompute": None, "release": "0.26.0"}) is None


def test_known_bugs_are_counted_not_failed_unless_strict(tmp_path, capsys, monkeypatch):
    """The spec models vLLM 0.33 exactly, so its sliding-window runs meet K1; the run passes and
    lists it, with one report; ``--strict-known`` turns the same meeting into a failure."""
    monkeypatch.delenv("KVSPEC_STRICT_KNOWN", raising=False)
    # K1 is met within 0.1 s
    args = ["fuzz", "--target", "spec", "--family", "sliding_window", "--seconds", "5", "--seed", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "known bug K1 (window_full_remote_load):" in out
    report = tmp_path / "a" / "known-K1-window_full_remote_load"
    assert (report / "trace.json").is_file()
    assert main([*args, "--out", str(tmp_path / "b"), "--strict-known"]) == 1
    assert "kv-ledger" in capsys.readouterr().out
    # The known bug's report is honest about replay: a plain replay counts the bug and passes, the
    # strict one (what report.md says, and the folder's pytest file runs) fails while it is there.
    text = (report / "report.md").read_text()
    assert "--strict-known` (exit 1 while the bug is there" in text
    # ... reduced (a replay with --strict-known keeps it while it still raises K1), under its family
    assert "- family: `sliding_window`" in text and "known bug K1 (window_full_remote_load)" in text
    # ... and its first paragraph says, in vLLM's terms, what the bug is and what this request did
    plain = text.split("**What went wrong.** ", 1)[1].split("\n", 1)[0]
    assert (
        plain.startswith("Known bug K1, in vLLM 0.23.0-0.34.0: ")
        and "docs/upstream/full-remote-load-window.md" in plain
    )
    assert re.search(r"Here request `r\d+`, computing token \d+, (reads|writes)", plain), plain
    steps = re.search(r"## Steps \((\d+), reduced from the (\d+) the run recorded\)", text)
    assert steps is not None and int(steps.group(1)) <= 20, text[:600]
    assert int(steps.group(1)) < int(steps.group(2))
    assert main(["replay", str(report)]) == 0
    assert main(["replay", str(report), "--strict-known"]) == 1
    (test_file,) = report.glob("test_replay_*.py")
    assert "strict_known=True" in test_file.read_text()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)], capture_output=True, text=True
    )
    assert r.returncode == 1, r.stdout[-2000:]  # fails while K1 is there


def test_fuzz_options_do_not_leak_into_the_environment(tmp_path, monkeypatch):
    import os

    monkeypatch.delenv("KVSPEC_STRICT_KNOWN", raising=False)
    monkeypatch.delenv("KVSPEC_LEDGER", raising=False)
    args = ["fuzz", "--target", "spec", "--family", "full", "--seconds", "1", "--out", str(tmp_path)]
    main([*args, "--strict-known", "--no-ledger"])
    assert "KVSPEC_STRICT_KNOWN" not in os.environ and "KVSPEC_LEDGER" not in os.environ


def test_a_meeting_is_described_in_vllms_terms():
    from kvspec.harness.ledger.known_bugs import describe_meeting, get_known_bug

    k2 = get_known_bug("K2")
    read = (
        "known bug K2 (window_invalid_block_recovery): kv_read_in_real_block: sliding_window(W=4, bs=2), prompt 2 "
        "tokens, position from external load, recomputed after load recovery. Request r2: token 4 reads position 1 "
        "in the null block (group 0); needs prefix #2 (first: r2 position 1), holds unwritten"
    )
    text = describe_meeting(k2, read)
    assert "Known bug K2, in vLLM 0.23.0-0.34.0: invalid-block recovery" in text and "spec:" not in text
    assert "request `r2`, computing token 4, reads position 1 from the null block (block 0) of group 0" in text
    assert "(sliding window, W=4, bs=2)" in text and "nothing written there" in text and k2.report in text
    write = read.replace("token 4 reads position 1 in the null block", "token 1 writes position 1 in block 7")
    assert "writes the KV of position 1 into block 7 of group 0" in describe_meeting(k2, write)
    other = describe_meeting(k2, "invariant conservation broken")  # another shape: the bug alone
    assert "Here request" not in other and k2.title in other
