"""The options of a kvspec run, checked before any work: a bad one is a ``UsageError`` (exit 2).

- ``FuzzOptions``: one fuzz run (``kvspec fuzz``, the pytest plugin, the mutant campaign's rows, the
  workers' benchmark), the only thing the fuzzing engine (``harness.run.fuzzing``, ``finish``,
  ``workers``, ``harness.vllm_sched.fuzz``) is given; built once, by ``FuzzOptions.from_namespace``
  from the command line (every option checked there) or by the constructor;
- ``MutantsOptions``: ``kvspec mutants`` (``harness.campaign``), which makes one ``FuzzOptions`` per row;
- ``from_environ``: the settings kvspec takes from the environment (``KVSPEC_DB``,
  ``KVSPEC_TARGET_MEMORY_MB``, ``KVSPEC_FULL_CHECK_EVERY``, ``KVSPEC_VLLM_PROFILE``), read only at the
  edges (the CLI, the pytest plugin) into the options; nothing below reads the environment, and the
  worker processes get the options themselves.

The command lines take their defaults from these classes, so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.run.paths import NotAFolder, probe_writable_folder

T = TypeVar("T")


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends each option with its default, unless its text already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        absent = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "default" in text or absent or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class UsageError(Exception):
    """Bad usage: the message names the option and why (the CLI exits 2 on it)."""


def _all_families() -> tuple[str, ...]:
    """``--family all`` (imported here, not at start-up: the families import Hypothesis)."""
    from kvspec.harness.world.families import FAMILIES

    return tuple(FAMILIES)


@dataclass(frozen=True)
class FuzzOptions:
    """One fuzz run; the defaults are ``kvspec fuzz``'s (its parser reads them from here)."""

    target: str = "spec"  # spec, vllm, impl, mutant:NAME, vllm-scheduler or package.module:factory
    families: tuple[str, ...] = field(default_factory=_all_families)  # --family, parsed
    seconds: float = 60.0  # the whole run, shrinking and reduction included (bounded runs)
    seed: int = 0
    out: str = "kvspec-reports"  # the report folder
    relation: str = "exact"  # harness.core.equality.RELATIONS
    profile: str = "dev"  # harness.run.profiles.PROFILES
    step_timeout: float = 10.0  # seconds one target call may take
    batch: int = 10  # examples per family before rotating
    shrink_seconds: int = 10  # Hypothesis' shrinking of a finding
    shrink_stall: int = 0  # Hypothesis shrinks until this many examples found no shorter trace (0: not at all)
    reduce_seconds: float = 15.0  # the trace reduction (harness.traces.reduce); 0: off
    stats: bool = False  # print the per-family counts at the end
    kv_check: bool = False  # the KV-content oracle around the target (harness.oracle)
    strict_known: bool = False  # known target bugs fail the run too
    no_ledger: bool = False  # the KV ledger off
    no_agreement: bool = False  # vllm-scheduler: kvspec's scheduler model not compared (harness.vllm_sched.mirror)
    no_world_checks: bool = False  # vllm-scheduler: the world's facts and conservation off (world_checks)
    db: str | None = None  # the example database (default $KVSPEC_DB, else the profile's)
    workers: int = 1  # processes on the one database (harness.run.workers)
    in_process: bool = False  # the target in kvspec's own process (a crash ends the run; for a debugger)
    junit_xml: str | None = None  # also write JUnit XML here
    sarif: str | None = None  # also write a SARIF log here (harness.run.ci_output)
    github_annotations: bool = False  # print GitHub workflow commands (GITHUB_ACTIONS=true)
    step_summary: str | None = None  # append Markdown to GitHub's step summary (GITHUB_STEP_SUMMARY)
    memory_mb: float | None = None  # the target's memory growth bound (KVSPEC_TARGET_MEMORY_MB; None: off)
    full_check_every: int | None = None  # whole observations every N operations (KVSPEC_FULL_CHECK_EVERY; None: auto)
    assume_release: str | None = (
        None  # the known vLLM release an unknown installed one is taken for (KVSPEC_VLLM_PROFILE)
    )

    def checks(self) -> CheckSettings:
        """How each lockstep of the run is checked (``harness.check.settings.CheckSettings``)."""
        return CheckSettings(
            relation=self.relation,
            step_timeout=self.step_timeout,
            ledger=not self.no_ledger,
            strict_known=self.strict_known,
            memory_mb=self.memory_mb,
            full_check_every=self.full_check_every,
            kv_check=self.kv_check,
        )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, environ: Mapping[str, str]) -> FuzzOptions:
        """``kvspec fuzz``'s parsed options and the settings ``environ`` holds (``from_environ``), every
        one checked before any work (``UsageError`` names the option or variable and why)."""
        env = from_environ(environ)
        if ns.db is None:
            ns.db = env.pop("db")
        env.pop("db", None)
        families = _check_fuzz_options(ns)  # --relation left out (None): the default here; ``kvspec fuzz``
        return _built(cls, ns, families=families, relation=ns.relation or cls.relation, **env)  # then asks the target


@dataclass(frozen=True)
class MutantsOptions:
    """``kvspec mutants``; the defaults are its parser's (``harness.campaign.add_parser``)."""

    target: str | None = None  # a user's package.module:factory, whose mutants run instead of the catalogue
    mutants: str | None = None  # the user's package.module:callable returning {name: factory}
    family: str = "full"  # families of a user's mutants
    relation: str | None = None  # equality relation of a user's mutants (None: the target's, relation_choice)
    only: str | None = None  # comma-separated mutant names (or origin:spec, ...)
    seconds: float = 60.0  # per mutant
    shrink_seconds: int = 10
    shrink_stall: int = 0
    reduce_seconds: float = 15.0
    seed: int = 11
    profile: str = "ci"
    batch: int = 25
    step_timeout: float = 10.0
    use_db: bool = False  # the example database (default: none, for honest timings)
    out: str = "kvspec-reports/mutants"
    no_vllm: bool = False  # leave out the runtime vLLM mutants
    control_seconds: float = 10.0  # how long the unmutated user target is fuzzed first

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> MutantsOptions:
        """``kvspec mutants``' parsed options, checked (``UsageError``)."""
        from kvspec.harness.run.profiles import profile_settings

        if ns.seconds <= 0:
            raise UsageError("--seconds must be > 0")
        check_numbers(ns, (NumberRange("--shrink-stall", 0, 1_000_000),))
        with _as_usage_error():
            profile_settings(ns.profile)
        if ns.target is not None and ns.relation is not None:
            _check_relation(ns.relation)
        return _built(cls, ns)

    def fuzz_options(self, target: str, families: tuple[str, ...], relation: str) -> FuzzOptions:
        """The fuzz run of one row of the campaign: ``target`` in ``families`` under ``relation``."""
        return FuzzOptions(
            target=target,
            families=families,
            relation=relation,
            seconds=self.seconds,
            seed=self.seed,
            out=self.out,
            profile=self.profile,
            batch=self.batch,
            shrink_seconds=self.shrink_seconds,
            shrink_stall=self.shrink_stall,
            reduce_seconds=self.reduce_seconds,
            step_timeout=self.step_timeout,
        )

    def control(self) -> MutantsOptions:
        """The options the unmutated user target is fuzzed with first (for ``--control-seconds``)."""
        return replace(self, seconds=self.control_seconds)


def _built(cls: type[T], ns: argparse.Namespace, **given: Any) -> T:
    """``cls`` (a dataclass) from the parsed options of its fields' names, ``given`` besides."""
    parsed = {f.name: getattr(ns, f.name) for f in fields(cls) if f.name not in given}  # type: ignore[arg-type]
    return cls(**parsed, **given)


@contextlib.contextmanager
def _as_usage_error() -> Iterator[None]:
    """A ``ValueError`` of a check (its message names the option or variable) as a ``UsageError``."""
    try:
        yield
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_choices(family: str, relation: str | None) -> tuple[str, ...]:
    """``--family`` parsed and ``--relation`` checked, unless left out (``UsageError`` says why not); the
    families."""
    from kvspec.harness.world.families import parse_families

    with _as_usage_error():
        families = tuple(parse_families(family))
    if relation is not None:
        _check_relation(relation)
    return families


def _check_relation(relation: str) -> None:
    from kvspec.harness.core.equality import RELATIONS

    if relation not in RELATIONS:
        raise UsageError(f"unknown relation {relation!r} (known: {', '.join(RELATIONS)})")


def _check_fuzz_options(ns: argparse.Namespace) -> tuple[str, ...]:
    """Every option of ``fuzz``, checked before any work (``UsageError`` says which and why); the families."""
    from kvspec.harness.run.profiles import check_database, profile_settings

    check_numbers(ns, FUZZ_NUMBERS)
    families = check_choices(ns.family, ns.relation)
    if not ns.out:
        raise UsageError("--out '': an empty path; name the report folder")
    check_writable_folder("--out", ns.out, ns.out)
    with _as_usage_error():
        check_database(ns.db)
        profile_settings(ns.profile)
    for option, path in (("--junit-xml", ns.junit_xml), ("--sarif", ns.sarif)):
        if path is not None:
            if not path or Path(path).is_dir():
                raise UsageError(f"{option} {path!r}: not a file name (empty, or a folder)")
            check_writable_folder(option, str(Path(path).parent), path)
    return families


@dataclass(frozen=True)
class NumberRange:
    """The values a numeric option accepts: finite, ``> low`` (``low_open``) or ``>= low``, and ``<= high``."""

    option: str
    low: float
    high: float = math.inf
    low_open: bool = False

    def problem(self, value: float) -> str | None:
        """None if ``value`` is accepted, else the message naming the option, the rule and the value."""
        above = value > self.low if self.low_open else value >= self.low
        if math.isfinite(value) and above and value <= self.high:
            return None
        rule = f"{'>' if self.low_open else '>='} {self.low:.15g}"
        if self.high < math.inf:
            rule += f" and <= {self.high:.15g}"
        kind = "an integer" if isinstance(value, int) else "a finite number"
        return f"{self.option} must be {rule} ({kind}), got {value!r}"


DAY = 86_400
# Every numeric option of ``fuzz`` (``--seed`` takes any integer).
FUZZ_NUMBERS = (
    NumberRange("--seconds", 0, low_open=True),
    NumberRange("--step-timeout", 0, DAY, low_open=True),
    NumberRange("--batch", 1, 1_000_000),
    NumberRange("--shrink-seconds", 0, DAY),
    NumberRange("--shrink-stall", 0, 1_000_000),
    NumberRange("--reduce-seconds", 0, DAY),
    NumberRange("--workers", 1, 256),
)


def check_numbers(ns: argparse.Namespace, table: tuple[NumberRange, ...]) -> None:
    """Every option of ``table`` in its range (``UsageError`` names the first that is not): the one
    check of numbers for ``fuzz``, ``mutants``, ``releases diff`` and ``pd``."""
    for r in table:
        value = getattr(ns, r.option[2:].replace("-", "_"))
        problem = None if value is None else r.problem(value)  # None: not given (the command's default applies)
        if problem is not None:
            raise UsageError(problem)


def check_writable_folder(option: str, folder: str, shown: str) -> None:
    """``probe_writable_folder(folder)``; ``UsageError`` names ``option``, the path as given (``shown``)
    and the problem."""
    try:
        probe_writable_folder(folder)
    except NotAFolder as e:
        raise UsageError(f"{option} {shown!r}: {e}") from None
    except OSError as e:
        raise UsageError(f"{option} {shown!r}: cannot create it or write in it: {e.strerror or e}") from None
    except ValueError as e:  # a NUL in the path
        raise UsageError(f"{option} {shown!r}: not a usable path: {e}") from None


def check_new_file(option: str, path: str) -> None:
    """``path`` names a file that does not exist yet, in a folder that can be written (nothing is ever
    overwritten; ``UsageError`` says why not)."""
    if not path:
        raise UsageError(f"{option} '': an empty path; name a new file")
    if os.path.lexists(path):
        raise UsageError(f"{option} {path!r}: already exists; kvspec never overwrites a file, name a new one")
    check_writable_folder(option, str(Path(path).parent), path)


def from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings kvspec takes from the environment, checked (``UsageError`` names the variable):
    ``db`` (``KVSPEC_DB``), ``memory_mb`` (``KVSPEC_TARGET_MEMORY_MB``), ``full_check_every``
    (``KVSPEC_FULL_CHECK_EVERY``), ``assume_release`` (``KVSPEC_VLLM_PROFILE``), and under GitHub
    Actions ``github_annotations`` (``GITHUB_ACTIONS=true``) and ``step_summary``
    (``GITHUB_STEP_SUMMARY``).  Only the edges call it: the CLI, the pytest plugin."""
    from kvspec.harness.check.memory_guard import parse_memory_bound
    from kvspec.harness.core.glimpse import parse_full_check_every

    with _as_usage_error():
        return {
            "db": environ.get("KVSPEC_DB") or None,
            "memory_mb": parse_memory_bound(environ.get("KVSPEC_TARGET_MEMORY_MB", "")),
            "full_check_every": parse_full_check_every(environ.get("KVSPEC_FULL_CHECK_EVERY", "auto")),
            "assume_release": environ.get("KVSPEC_VLLM_PROFILE", "").strip() or None,
            "github_annotations": environ.get("GITHUB_ACTIONS", "") == "true",
            "step_summary": environ.get("GITHUB_STEP_SUMMARY", "").strip() or None,
        }
