"""docs/architecture.md, followed as a newcomer would: add a family and a mutant exactly as it says.

Each test takes the doc's code block for the step, runs it where the doc says it goes (the module's
namespace, with the registry copied so nothing leaks into other tests), and then uses the new thing
through the command line. A doc whose recipe does not work, or a registry the recipe does not
reach, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kvspec.harness.cli import main
from kvspec.harness.world import families

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def doc_code(section: str) -> str:
    """The first ```python block under the ``### <section>`` heading of docs/architecture.md."""
    text = DOC.read_text()
    m = re.search(rf"^### {re.escape(section)}\n(.*?)(?=^### |^## |\Z)", text, re.M | re.S)
    assert m, f"docs/architecture.md has no '### {section}' section"
    code = re.search(r"```python\n(.*?)```", m.group(1), re.S)
    assert code, f"docs/architecture.md, '### {section}': no python example"
    return code.group(1)


def run_in_module(code: str, module: Any) -> None:
    """Run the doc's snippet as if written at the end of ``module``."""
    exec(compile(code, str(DOC), "exec"), vars(module))  # noqa: S102 - our own doc, the point of the test


def test_a_family_added_as_the_doc_says_is_fuzzed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(families, "REGISTRY", dict(families.REGISTRY))
    before = set(families.REGISTRY)
    run_in_module(doc_code("A family"), families)
    (name,) = set(families.REGISTRY) - before
    assert name in families.parse_families("all")
    assert families.REGISTRY[name].doc, "the family's docstring is its summary"
    out = tmp_path / "reports"
    rc = main(["fuzz", "--target", "spec", "--family", name, "--seconds", "4", "--seed", "1", "--out", str(out)])
    summary = capsys.readouterr().out
    assert rc == 0 and f"families {name}" in summary, summary
    steps = int(re.search(r"(\d+) steps in", summary).group(1))  # type: ignore[union-attr]
    assert steps > 0
    assert main(["fuzz", "--family", name + "_not_added", "--seconds", "1", "--out", str(out)]) == 2


def test_a_mutant_added_as_the_doc_says_is_killed_by_its_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvspec.harness.mutants import invariants, spec
    from kvspec.harness.mutants.record import Mutant

    code = doc_code("A mutant")
    *definitions, entry = code.strip().split("\n\n\n")  # the wrapper, then the catalogue entry
    run_in_module("\n\n\n".join(definitions), invariants)
    mutant = eval(compile(entry, str(DOC), "eval"), vars(invariants))  # noqa: S307 - our own doc
    assert isinstance(mutant, Mutant) and mutant.intended
    assert mutant.name not in spec.SPEC_MUTANTS, "the doc's example must be a new mutant"
    # What adding the entry to the tuple does at import: it is in the catalogue and in every spec mutant.
    monkeypatch.setitem(invariants.MUTANTS, mutant.name, mutant)
    monkeypatch.setitem(spec.SPEC_MUTANTS, mutant.name, mutant)
    capsys.readouterr()
    rc = main(["mutants", "--only", mutant.name, "--seconds", "60", "--no-vllm", "--out", str(tmp_path / "r")])
    table = capsys.readouterr().out
    assert rc == 0, table
    row = next(line for line in table.splitlines() if mutant.name in line)
    assert mutant.intended in row, row


def test_a_driver_added_as_the_doc_says_runs_through_the_cli_and_replays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The doc's third driver, added by its recipe alone (neither the CLI nor the loop changes): the
    one loop runs it clean on the spec; over a target with a bug it finds, reduces and reports; and
    ``kvspec replay`` re-runs the report through the same driver."""
    import dataclasses
    import types

    from kvspec.harness.mutants.spec import make_mutant
    from kvspec.harness.run import catalogue

    monkeypatch.setattr(catalogue, "BUILTIN", dict(catalogue.BUILTIN))
    run_in_module(doc_code("A driver"), types.ModuleType("kvspec_doc_driver"))
    assert "corpus" in catalogue.BUILTIN
    out = tmp_path / "reports"
    args = ["fuzz", "--target", "corpus", "--family", "full", "--seconds", "30", "--out", str(out)]
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr()
    summary = capsys.readouterr().out
    assert "no finding; target corpus, 4 examples" in summary and "4 corpus traces replayed" in summary, summary

    clean = catalogue.BUILTIN["corpus"]

    def buggy(assume_release: str | None) -> Any:
        return dataclasses.replace(clean(assume_release), factory=lambda: make_mutant("free_order_appended"))

    monkeypatch.setitem(catalogue.BUILTIN, "corpus", buggy)
    assert main(args) == 1
    text = capsys.readouterr().out
    assert "FOUND" in text and "report written to" in text, text
    (report,) = out.iterdir()
    assert main(["replay", str(report)]) == 1  # the recorded target, through the same driver: still failing
    monkeypatch.setitem(catalogue.BUILTIN, "corpus", clean)
    assert main(["replay", str(report)]) == 0  # on the correct spec the reduced trace behaves as recorded
