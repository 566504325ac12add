"""The options of a fuzz run (``kvspec.harness.run.options``): one frozen ``FuzzOptions``, built once, the
same from every entry point, and every bad value a ``UsageError`` naming the option (exit 2)."""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest

import kvspec.harness.cli
import kvspec.harness.run.fuzzing
import kvspec.harness.run.supervise
import kvspec.harness.run.workers
from kvspec.harness.bench.workers import measure
from kvspec.harness.campaign import builtin_entries, run_entry
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.cli import _parser, main
from kvspec.harness.run import pytest_plugin
from kvspec.harness.run.fuzzing import FuzzResult
from kvspec.harness.run.options import FuzzOptions, MutantsOptions, UsageError, from_environ

BUG = "mutant:hit_cap_num_tokens"


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    """Run in ``tmp_path`` (the default ``--out`` is probed there) with none of kvspec's variables set."""
    monkeypatch.chdir(tmp_path)
    for name in ("DB", "LEDGER", "STRICT_KNOWN", "TARGET_MEMORY_MB", "FULL_CHECK_EVERY", "VLLM_PROFILE"):
        monkeypatch.delenv(f"KVSPEC_{name}", raising=False)


def cli_options(*argv: str) -> FuzzOptions:
    """What ``kvspec fuzz ARGV`` runs with."""
    return FuzzOptions.from_namespace(_parser().parse_args(["fuzz", *argv]), {})


@pytest.mark.parametrize("opts", [FuzzOptions(), MutantsOptions()], ids=["fuzz", "mutants"])
def test_options_are_frozen(opts):
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 1


def test_fuzz_parser_defaults_are_the_dataclass_defaults():
    ns = _parser().parse_args(["fuzz"])
    assert FuzzOptions.from_namespace(ns, {}) == FuzzOptions()
    # Every option of the parser is a field (``--family`` parsed into ``families``), and back; the rest
    # of the fields are read from the environment at the edges (``from_environ``), ``--db`` both ways.
    env_only = set(from_environ({})) - {"db"}
    fields = {f.name for f in dataclasses.fields(FuzzOptions)} - {"families"}
    assert set(vars(ns)) - {"command", "family"} == fields - env_only


def test_mutants_parser_defaults_are_the_dataclass_defaults():
    ns = _parser().parse_args(["mutants"])
    assert MutantsOptions.from_namespace(ns) == MutantsOptions()
    assert set(vars(ns)) - {"command"} == {f.name for f in dataclasses.fields(MutantsOptions)}


class Config:
    """The part of ``pytest.Config`` the plugin reads."""

    def __init__(self, **options):
        self.options, self.args = options, []

    def getoption(self, name):
        return self.options[name]

    def addinivalue_line(self, name, line):
        pass


def test_the_pytest_plugin_builds_the_cli_options(tmp_path):
    out = str(tmp_path / "r")
    config = Config(
        kvspec_target=BUG,
        kvspec_family="full,sliding_window",
        kvspec_relation="outcomes",
        kvspec_out=out,
        kvspec_db=None,
        kvspec_step_timeout=5.0,
        kvspec_shrink_seconds=7,
        kvspec_only=False,
    )
    pytest_plugin.pytest_configure(config)
    try:
        assert pytest_plugin._SUITE is not None
        built = pytest_plugin._SUITE.options
    finally:
        pytest_plugin.pytest_unconfigure(config)
    args = ("--family", "full,sliding_window", "--relation", "outcomes", "--out", out, "--step-timeout", "5")
    assert built == cli_options("--target", BUG, *args, "--shrink-seconds", "7")
    # The ``kvspec`` fixture's options are the same, less the suite's choices.
    assert pytest_plugin.plugin_options(config) == cli_options(
        "--out", out, "--step-timeout", "5", "--shrink-seconds", "7"
    )


@pytest.mark.parametrize("mode", ["exact", "self"])
def test_a_campaign_row_runs_the_cli_options(monkeypatch, tmp_path, mode):
    seen = []
    monkeypatch.setattr(
        kvspec.harness.run.fuzzing, "run_fuzz", lambda opts, *a, **kw: seen.append(opts) or FuzzResult()
    )
    # in this process (a row runs supervised, in a child whose ``seen`` this test would not see)
    monkeypatch.setattr(kvspec.harness.run.supervise, "supervised", lambda opts, body, entry=None: body())
    out = str(tmp_path / "m")
    ns = _parser().parse_args(["mutants", "--seconds", "5", "--seed", "3", "--batch", "7", "--out", out])
    entry = next(e for e in builtin_entries(with_vllm=False) if e.origin == "spec" and e.mode == mode)
    run_entry(entry, MutantsOptions.from_namespace(ns))
    family = ",".join(entry.families)
    cli = ("--target", entry.target, "--family", family, "--seconds", "5", "--seed", "3", "--batch", "7")
    assert seen == [cli_options(*cli, "--profile", "ci", "--out", out)]  # the self mode: relation exact


def test_the_campaign_control_is_fuzzed_for_control_seconds():
    assert MutantsOptions(seconds=60, control_seconds=3).control() == MutantsOptions(seconds=3, control_seconds=3)


def test_the_workers_benchmark_runs_the_cli_options(monkeypatch):
    seen = []

    def fuzz_workers(opts, progress=False):
        seen.append(opts)
        return FuzzResult(elapsed=1.0)

    monkeypatch.setattr(kvspec.harness.run.workers, "fuzz_workers", fuzz_workers)
    measure("spec", "full", 3.0, 2, seed=5)
    (opts,) = seen
    assert "kvspec-bench-db-" in opts.db and "KVSPEC_DB" not in os.environ  # passed in the options
    cli = cli_options("--family", "full", "--seconds", "3", "--workers", "2", "--seed", "5", "--db", opts.db)
    assert opts == cli
    assert pickle.loads(pickle.dumps(opts)) == opts  # as the workers receive it


def test_the_environment_is_read_at_the_edge_into_the_options():
    """``KVSPEC_*`` variables become fields of the options the CLI builds (nothing below reads them), and
    the checks every lockstep of the run gets carry them; ``--db`` wins over ``KVSPEC_DB``."""
    env = {
        "KVSPEC_DB": "from-env",
        "KVSPEC_TARGET_MEMORY_MB": "64",
        "KVSPEC_FULL_CHECK_EVERY": "8",
        "KVSPEC_VLLM_PROFILE": "0.34.0",
    }
    opts = FuzzOptions.from_namespace(_parser().parse_args(["fuzz", "--no-ledger", "--strict-known"]), env)
    assert (opts.db, opts.memory_mb, opts.full_check_every, opts.assume_release) == ("from-env", 64.0, 8, "0.34.0")
    want = CheckSettings(ledger=False, strict_known=True, memory_mb=64.0, full_check_every=8)
    assert opts.checks() == want
    given = FuzzOptions.from_namespace(_parser().parse_args(["fuzz", "--db", "given"]), env)
    assert given.db == "given"
    bad = {"KVSPEC_FULL_CHECK_EVERY": "often"}
    with pytest.raises(UsageError, match="KVSPEC_FULL_CHECK_EVERY"):
        FuzzOptions.from_namespace(_parser().parse_args(["fuzz"]), bad)


BAD = [
    # (arguments, the option named, a fragment of the message); {file} is an existing file
    (["--seconds", "nan"], "--seconds", "got nan"),
    (["--seconds", "inf"], "--seconds", "got inf"),
    (["--seconds", "0"], "--seconds", "must be > 0"),
    (["--step-timeout", "inf"], "--step-timeout", "got inf"),
    (["--step-timeout", "86401"], "--step-timeout", "<= 86400"),
    (["--batch", "0"], "--batch", ">= 1"),
    (["--shrink-seconds", "-1"], "--shrink-seconds", ">= 0"),
    (["--reduce-seconds=-inf"], "--reduce-seconds", "got -inf"),
    (["--workers", "257"], "--workers", "<= 256"),
    (["--out", "{file}"], "--out", "is a file, not a folder"),
    (["--out", "{file}/deeper"], "--out", "is a file, not a folder"),
    (["--out", ""], "--out", "an empty path"),
    (["--junit-xml", "{file}/j.xml"], "--junit-xml", "is a file, not a folder"),
    (["--family", "nope"], "unknown family", "nope"),
    (["--relation", "nope"], "unknown relation", "nope"),
    (["--profile", "nope"], "unknown profile", "nope"),
]


@pytest.fixture
def no_fuzzing(monkeypatch):
    """Fail the test if ``kvspec fuzz`` gets past its options."""

    def fuzz(opts):
        raise AssertionError(f"fuzzing started with {opts}")

    monkeypatch.setattr(kvspec.harness.cli, "fuzz", fuzz)


def expect_usage_error(argv, option, fragment, capsys):
    """``argv`` is a ``UsageError`` naming ``option`` where the options are built, and ``kvspec fuzz``
    exits 2 printing exactly its message."""
    with pytest.raises(UsageError) as e:
        cli_options(*argv)
    assert option in str(e.value) and fragment in str(e.value)
    assert main(["fuzz", *argv]) == 2
    assert capsys.readouterr().err == f"kvspec fuzz: {e.value}\n"


@pytest.mark.parametrize("argv, option, fragment", BAD, ids=[" ".join(b[0]) or "empty" for b in BAD])
def test_bad_values_are_usage_errors_naming_the_option(no_fuzzing, tmp_path, capsys, argv, option, fragment):
    (tmp_path / "a-file").write_text("not a folder\n")
    expect_usage_error([a.format(file=tmp_path / "a-file") for a in argv], option, fragment, capsys)


def test_an_unwritable_out_is_a_usage_error(no_fuzzing, monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.mkstemp", refused)  # the probe (root writes into a read-only folder anyway)
    expect_usage_error(["--out", "reports"], "--out 'reports'", "cannot create it or write in it", capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seconds", "0"], "--seconds must be > 0"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--target", "x:y", "--relation", "nope"], "unknown relation 'nope'"),
    ],
)
def test_bad_mutants_options_are_usage_errors(monkeypatch, capsys, argv, message):
    monkeypatch.setattr("kvspec.harness.campaign.mutants_cmd", lambda opts: pytest.fail("the campaign started"))
    with pytest.raises(UsageError, match=message):
        MutantsOptions.from_namespace(_parser().parse_args(["mutants", *argv]))
    assert main(["mutants", *argv]) == 2
    assert message in capsys.readouterr().err
