"""``kvspec fuzz --help`` and ``kvspec mutants --help`` show every option's default and list every
built-in target (issue 36: a CLI people like)."""

from __future__ import annotations

import re

import pytest

from kvspec.harness.cli import main
from kvspec.harness.run.catalogue import BUILTIN


def help_text(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_fuzz_help_shows_defaults_and_every_target(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text("fuzz", capsys)
    for option, default in (("--seconds", "60.0"), ("--seed", "0"), ("--target", "spec"), ("--family", "all")):
        assert re.search(rf"{option} \S+ .*?\(default: {re.escape(default)}\)", text), option
    for name in BUILTIN:
        assert re.search(rf"\b{re.escape(name)}\b", text.replace("- ", "-")), name


def test_mutants_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert "(default:" in help_text("mutants", capsys)
