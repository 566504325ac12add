"""``--junit-xml`` on fuzz and replay, and ``kvspec fuzz --workers N`` (one progress line, one
summary, the first finding stops all and writes one report)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ci_helpers import REPO, kvspec

from kvspec.harness.run.junit import Case, render_junit, write_junit

CORPUS = REPO / "tests" / "corpus"


def suite(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (ts,) = root.findall("testsuite")
    assert int(ts.get("tests")) == len(ts.findall("testcase"))
    return ts


def test_fuzz_junit_has_one_case_per_family(tmp_path):
    """The worked example passes no_cache and models none of sliding_window (a skipped case)."""
    r = kvspec(
        "fuzz",
        "--target",
        "examples.my_manager:make_target",
        "--relation",
        "invariants",
        "--family",
        "no_cache,sliding_window",
        "--seconds",
        "3",
        "--batch",
        "1",  # rotate after each example: both families are reached even on a loaded machine
        "--junit-xml",
        "j/fuzz.xml",
        "--db",
        "db",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    ts = suite(tmp_path / "j" / "fuzz.xml")
    cases = list(ts.iter("testcase"))
    assert [c.get("name") for c in cases] == ["no_cache", "sliding_window"]
    assert ts.get("failures") == "0" and ts.get("skipped") == "1"
    assert not cases[0].findall("skipped") and "models none" in cases[1].find("skipped").get("message")


def test_fuzz_junit_failure_names_the_finding_and_report(tmp_path):
    r = kvspec(
        "fuzz",
        "--target",
        "mutant:hits_not_touched",
        "--family",
        "full",
        "--seconds",
        "30",
        "--shrink-seconds",
        "2",
        "--junit-xml",
        "fuzz.xml",
        "--out",
        "reports",
        "--db",
        "db",
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr
    ts = suite(tmp_path / "fuzz.xml")
    (failure,) = ts.iter("failure")
    assert failure.get("type") == "divergence" and failure.get("message", "").startswith("divergence at step")
    report = next((tmp_path / "reports").iterdir())
    assert f"report: reports/{report.name}" in (failure.text or "")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "a temporary file was left behind"


def test_replay_junit_has_one_case_per_trace_and_fails_a_changed_one(tmp_path):
    d = json.loads((CORPUS / "hits_not_touched.json").read_text())
    lookups = [s for s in d["steps"] if s["op"] == "get_computed_blocks"]
    lookups[0]["outcome"]["num_hit_tokens"] += 1
    (tmp_path / "changed.json").write_text(json.dumps(d))
    r = kvspec(
        "replay",
        str(CORPUS / "free_order_appended.json"),
        "changed.json",
        "--target",
        "spec",
        "--junit-xml",
        "replay.xml",
        cwd=tmp_path,
    )
    assert r.returncode == 1
    ts = suite(tmp_path / "replay.xml")
    cases = {c.get("name"): c for c in ts.iter("testcase")}
    assert set(cases) == {str(CORPUS / "free_order_appended.json"), "changed.json"}
    assert not cases[str(CORPUS / "free_order_appended.json")].findall("failure")
    (failure,) = cases["changed.json"].findall("failure")
    assert "differs from the recorded one" in failure.get("message", "") and "trace: changed.json" in (
        failure.text or ""
    )


def test_junit_writer_escapes_and_replaces_atomically(tmp_path):
    path = tmp_path / "out.xml"
    path.write_text("old")
    write_junit(path, "s", [Case("c", "a\x01b", 1.0, failure="bad <&> \x02", details="x"), Case("c", "ok", 0.5)], 1.5)
    ts = suite(path)
    assert ts.get("failures") == "1" and [c.get("name") for c in ts.iter("testcase")] == ["a?b", "ok"]
    assert list(tmp_path.iterdir()) == [path]
    assert b"\x02" not in render_junit("s", [Case("c", "n", failure="\x02")], 0.0)


def test_workers_first_finding_stops_all_and_writes_one_report(tmp_path):
    r = kvspec(
        "fuzz",
        "--target",
        "mutant:hits_not_touched",
        "--family",
        "full",
        "--workers",
        "2",
        "--seconds",
        "60",
        "--shrink-seconds",
        "2",
        "--out",
        "reports",
        "--db",
        "db",
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("kvspec fuzz: FOUND") == 1 and r.stdout.count("report written to") == 1
    assert len(list((tmp_path / "reports").iterdir())) == 1
    assert "after" in r.stdout and float(r.stdout.split(" after ")[-1].split("s")[0]) < 60  # stopped early


def test_workers_without_a_finding_print_one_summary(tmp_path):
    r = kvspec(
        "fuzz", "--target", "spec", "--family", "full", "--workers", "2", "--seconds", "2", "--db", "db", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("kvspec fuzz: no finding") == 1, r.stdout


def test_bad_worker_count_and_database_are_usage_errors(tmp_path):
    r = kvspec("fuzz", "--workers", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--workers must be >= 1" in r.stderr
    r = kvspec("fuzz", "--db", "redis://localhost:notaport/0", cwd=tmp_path)
    assert r.returncode == 2 and "port" in r.stderr
    r = kvspec("fuzz", "--db", "ftp://x/y", cwd=tmp_path)
    assert r.returncode == 2 and "unknown scheme" in r.stderr
