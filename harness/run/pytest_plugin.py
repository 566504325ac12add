"""kvspec as a pytest plugin (entry point ``pytest11``: loaded wherever kvspec is installed).

A team's own suite runs kvspec against its manager::

    pytest --kvspec-target mypkg.adapter:make_target --kvspec-family full,sliding_window
    pytest --kvspec-target mypkg.adapter:make_target --kvspec-only      # kvspec's machines only

Each family becomes one test, ``TestKVSpec_<family>`` (marked ``kvspec``), whose body is kvspec's
state machine: the Hypothesis profile that is loaded (``--hypothesis-profile``; kvspec registers
``kvspec-dev``, ``kvspec-ci``, ``kvspec-nightly``) sets the budget, and the example database is
``--kvspec-db`` / ``KVSPEC_DB`` when given, else the profile's own, so past failures are replayed
first.  A finding fails the test with its one-line summary and the path of the report written
under ``--kvspec-out``.  The tests are ordinary Hypothesis state-machine tests, so HypoFuzz fuzzes
them on many cores (``hypothesis fuzz -n 4 -- --kvspec-target ... --kvspec-only``); each machine
prints its progress on stderr every few seconds (``progress_poll``), which is all a
``--no-dashboard`` run shows.  The header says the target, the relation in force and why
(``kvspec.harness.run.relation_choice``), and the run's size; a family the target models no config of
is skipped, saying why.

In a test of one's own, the ``kvspec`` fixture does the same for one target and family::

    def test_my_manager(kvspec):
        kvspec.check("mypkg.adapter:make_target", family="full", relation="invariants")
"""

from __future__ import annotations

import argparse
import os
import unittest
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kvspec.harness.run import profiles as _profiles  # noqa: F401  (registers kvspec-dev / -ci / -nightly before --hypothesis-profile is read)
from kvspec.harness.run.options import (
    DAY,
    FuzzOptions,
    NumberRange,
    UsageError,
    check_choices,
    check_numbers,
    check_writable_folder,
    from_environ,
)

SUITE = Path(__file__).with_name("pytest_suite.py")


@dataclass(frozen=True)
class Suite:
    """What ``--kvspec-target`` configured, read by ``kvspec.harness.run.pytest_suite``: the options, the
    target's factory and the example database (both resolved once)."""

    options: FuzzOptions
    factory: Callable[[], Any]
    db: Any
    relation_line: str = ""  # which relation is in force and why (the report header)


_SUITE: Suite | None = None  # None without --kvspec-target


def pytest_addoption(parser: pytest.Parser) -> None:
    D = FuzzOptions  # kvspec fuzz's defaults (but shrinking: 20 seconds here)
    g = parser.getgroup("kvspec", "kvspec: differential fuzzing of a KV-cache manager against vLLM 0.33's model")
    g.addoption("--kvspec-target", default=None, help="spec, vllm, impl, mutant:NAME or package.module:factory")
    g.addoption("--kvspec-family", default="all", help="comma-separated families, or 'all' (default)")
    g.addoption(
        "--kvspec-relation",
        default=None,
        help="exact, outcomes or invariants (default: the target's own, said in the header)",
    )
    g.addoption("--kvspec-out", default=D.out, help="where reports of findings are written")
    g.addoption(
        "--kvspec-db",
        default=D.db,
        help="example database: folder or redis://host:port/n (default: KVSPEC_DB, else the profile's)",
    )
    g.addoption("--kvspec-step-timeout", type=float, default=D.step_timeout, help="seconds one target call may take")
    g.addoption("--kvspec-shrink-seconds", type=int, default=20, help="time bound for shrinking a finding (default 20)")
    g.addoption("--kvspec-only", action="store_true", help="collect only kvspec's machines, not the rest of the suite")


@pytest.hookimpl(trylast=True)  # after Hypothesis' plugin has loaded --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    global _SUITE
    config.addinivalue_line("markers", "kvspec: a kvspec state machine (pytest --kvspec-target)")
    target = config.getoption("kvspec_target")
    if target is None:
        if config.getoption("kvspec_only"):
            raise pytest.UsageError("kvspec: --kvspec-only needs --kvspec-target (there is nothing of kvspec's to run)")
        return
    from kvspec.harness.run.catalogue import resolve
    from kvspec.harness.run.relation_choice import choose_relation
    from kvspec.harness.targets import TargetLoadError

    given = config.getoption("kvspec_relation")
    try:
        families = check_choices(config.getoption("kvspec_family"), given)
        entry = _lockstep_entry(resolve(target, from_environ(os.environ)["assume_release"]))
        factory = entry.factory
        choice = choose_relation(given, entry)
        db = _database(config.getoption("kvspec_db"))
    except (UsageError, ValueError, TargetLoadError) as e:
        raise pytest.UsageError(f"kvspec: {e}") from None
    opts = plugin_options(config, target=target, families=families, relation=choice.relation)
    opts = replace(opts, **{k: v for k, v in from_environ(os.environ).items() if k != "db"})
    _SUITE = Suite(opts, factory, db, f"kvspec: target {target}, {choice.line()}")
    if config.getoption("kvspec_only"):
        config.args[:] = [str(SUITE)]
    elif str(SUITE) not in config.args:
        config.args.append(str(SUITE))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The run's first lines: the target, the relation in force and why, the families and the budget."""
    if _SUITE is None:
        return []
    from hypothesis import settings

    s = settings()
    profile = getattr(settings, "_current_profile", None) or "default"
    fams = _SUITE.options.families
    return [
        _SUITE.relation_line,
        f"kvspec: {len(fams)} test(s), one per family ({','.join(fams)}); each up to {s.max_examples} examples "
        f"of {s.stateful_step_count} steps (Hypothesis profile {profile})",
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    global _SUITE
    _SUITE = None


PLUGIN_NUMBERS = (NumberRange("--step-timeout", 0, DAY, low_open=True), NumberRange("--shrink-seconds", 0, DAY))


def plugin_options(config: pytest.Config, **chosen: Any) -> FuzzOptions:
    """The ``--kvspec-*`` options as one ``FuzzOptions``, with ``chosen`` (target, families, relation:
    checked by the caller) besides; checked like ``kvspec fuzz``'s (``pytest.UsageError`` names the
    option: a number out of range, an ``--kvspec-out`` that cannot be written)."""
    ns = argparse.Namespace(
        step_timeout=config.getoption("kvspec_step_timeout"), shrink_seconds=config.getoption("kvspec_shrink_seconds")
    )
    try:
        check_numbers(ns, PLUGIN_NUMBERS)
        check_writable_folder("--out", config.getoption("kvspec_out"), config.getoption("kvspec_out"))
    except UsageError as e:
        raise pytest.UsageError(f"kvspec: {str(e).replace('--', '--kvspec-', 1)}") from None
    return FuzzOptions(
        out=config.getoption("kvspec_out"),
        db=config.getoption("kvspec_db"),
        step_timeout=config.getoption("kvspec_step_timeout"),
        shrink_seconds=config.getoption("kvspec_shrink_seconds"),
        **chosen,
    )


def _lockstep_entry(entry: Any) -> Any:
    """``entry`` if the lockstep driver runs it (the plugin's machines are Hypothesis' state machines);
    ``UsageError`` otherwise."""
    from kvspec.harness.drivers.lockstep import LockstepDriver

    if entry.driver is not LockstepDriver:
        raise UsageError(f"target {entry.name} is not a manager the state machines drive; use kvspec fuzz")
    return entry


def _database(spec: str | None) -> Any:
    """``--kvspec-db``, else ``KVSPEC_DB``, else the loaded profile's database."""
    from hypothesis import settings

    from kvspec.harness.run.profiles import check_database

    if spec or os.environ.get("KVSPEC_DB"):
        return check_database(spec)
    return settings().database


def machine_settings(db: Any) -> Any:
    """The loaded Hypothesis profile, with what kvspec's machines need (no deadline, the database)."""
    from hypothesis import HealthCheck, settings

    return settings(
        settings.default,
        deadline=None,
        # Never derandomized, even under Hypothesis' own ``ci`` profile (loaded when CI is set): kvspec's
        # machines keep their failures in the example database, and HypoFuzz refuses a derandomized test.
        derandomize=False,
        database=db,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


def run_family(
    opts: FuzzOptions, factory: Callable[[], Any], family: str, db: Any = None, hyp_settings: Any = None
) -> None:
    """Run kvspec's state machine for ``family`` of ``opts`` (its target, relation, step timeout and
    shrinking bound; ``hyp_settings``, else the loaded profile on ``db``) as one turn of the lockstep
    driver (``kvspec.harness.drivers.lockstep``); a finding, reduced by the same driver, fails the test with
    its report path (under ``opts.out``)."""
    from kvspec.harness.run.finish import write_report_safely
    from kvspec.harness.traces.report import replay_command

    driver = lockstep_driver(opts, factory, hyp_settings or machine_settings(db))
    driver.plan((family,))
    out = driver.run_turn(family, None)
    if out.skipped is not None:  # the target declined every config of the family: nothing was checked
        pytest.skip(f"kvspec: {opts.target} models no config of family {family}: {out.skipped}")
    if out.found is None:
        if out.stopped is not None:
            pytest.fail(f"kvspec: the run stopped on {out.stopped}", pytrace=False)
        return
    found = driver.reduce(out.found, float(opts.reduce_seconds))
    report = write_report_safely(opts.out, found.trace)  # --kvspec-out failing at write time: the temp dir
    if report is None:
        pytest.fail(f"kvspec: {found.finding.summary()}\n(no report could be written anywhere)", pytrace=False)
    replay = replay_command(report, found.trace.target_name)
    pytest.fail(f"kvspec: {found.finding.summary()}\nreport: {report}\nreplay: {replay}", pytrace=False)


def lockstep_driver(opts: FuzzOptions, factory: Callable[[], Any], hyp_settings: Any, poll: Any = None) -> Any:
    """The lockstep driver of ``opts``' target under ``hyp_settings`` (pytest's or HypoFuzz's own)."""
    from kvspec.harness.drivers.base import DriveHooks, DriveSettings
    from kvspec.harness.drivers.lockstep import LockstepDriver

    settings = DriveSettings(
        target=opts.target,
        checks=opts.checks(),
        hypothesis=hyp_settings,
        shrink_seconds=opts.shrink_seconds,
        shrink_stall=opts.shrink_stall,
        reduce_seconds=opts.reduce_seconds,
    )
    return LockstepDriver(factory, settings, DriveHooks(poll=poll) if poll is not None else DriveHooks())


PROGRESS_SECONDS = 5.0


def progress_poll(name: str, stats: Any, every: float = PROGRESS_SECONDS) -> Callable[[], None]:
    """A ``RunStats.poll`` that prints what the machine has done, on stderr, at its first operation and
    then every ``every`` seconds: what a HypoFuzz run shows (``hypothesis fuzz --no-dashboard`` itself
    prints nothing past collection)."""
    import os
    import sys
    import time

    started: list[float] = []

    def poll() -> None:
        now = time.monotonic()
        if started and now - started[1] < every:
            return
        if not started:
            started[:] = [now, now]
            print(f"kvspec: {name} (pid {os.getpid()}): fuzzing started", file=sys.stderr, flush=True)
            return
        started[1] = now
        took = now - started[0]
        print(
            f"kvspec: {name} (pid {os.getpid()}): {stats.examples} examples, {stats.steps} steps in {took:.0f}s "
            f"({stats.steps / took:.0f} steps/s)",
            file=sys.stderr,
            flush=True,
        )

    return poll


def make_testcase(suite: Suite, family: str) -> type[unittest.TestCase]:
    """``TestKVSpec_<family>``: one unittest case whose ``runTest`` is kvspec's machine (HypoFuzz
    recognises it as a state-machine test through ``_hypothesis_state_machine_class``)."""
    o = suite.options
    driver = lockstep_driver(o, suite.factory, None)
    driver.stats.poll = progress_poll(f"TestKVSpec_{family}", driver.stats)  # HypoFuzz drives this machine directly
    machine = driver.machine(family)

    def runTest(self: unittest.TestCase) -> None:
        run_family(o, suite.factory, family, hyp_settings=type(self).settings)  # type: ignore[attr-defined]

    runTest.is_hypothesis_test = True  # type: ignore[attr-defined]
    runTest._hypothesis_state_machine_class = machine  # type: ignore[attr-defined]
    name = f"TestKVSpec_{family}"
    return type(
        name,
        (unittest.TestCase,),
        {
            "runTest": runTest,
            "settings": machine_settings(suite.db),
            "pytestmark": [pytest.mark.kvspec],
            "__module__": "kvspec.harness.run.pytest_suite",
        },
    )


def suite_testcases() -> dict[str, type[unittest.TestCase]]:
    """The test classes of ``kvspec.harness.run.pytest_suite``: one per family (none without ``--kvspec-target``)."""
    if _SUITE is None:
        return {}
    return {f"TestKVSpec_{fam}": make_testcase(_SUITE, fam) for fam in _SUITE.options.families}


class KVSpecFixture:
    """The ``kvspec`` fixture: ``check(target, family=..., relation=...)`` in a test of one's own."""

    def __init__(self, options: FuzzOptions, db: Any) -> None:
        self.options, self.db = options, db

    def check(self, target: str | Callable[[], Any], family: str = "full", relation: str | None = None) -> None:
        """Run ``target`` on ``family`` under ``relation`` (None: the target's own, relation_choice)."""
        from kvspec.harness.run.catalogue import CatalogueEntry, resolve
        from kvspec.harness.run.relation_choice import choose_relation
        from kvspec.harness.targets import TargetLoadError, check_target
        from kvspec.harness.world.families import parse_families

        try:
            if isinstance(target, str):
                entry = _lockstep_entry(resolve(target, self.options.assume_release))
            else:
                entry = CatalogueEntry(getattr(target, "__qualname__", "target"), target)
                check_target(entry.factory, entry.name)
            name, factory = entry.name, entry.factory
            families = tuple(parse_families(family))
            choice = choose_relation(relation, entry)
        except (ValueError, TargetLoadError, UsageError) as e:
            pytest.fail(f"kvspec: {e}", pytrace=False)
        opts = replace(self.options, target=name, families=families, relation=choice.relation)
        for fam in families:
            run_family(opts, factory, fam, self.db)


@pytest.fixture
def kvspec(pytestconfig: pytest.Config) -> KVSpecFixture:
    try:
        env = from_environ(os.environ)
        db = _database(pytestconfig.getoption("kvspec_db"))
    except (ValueError, UsageError) as e:
        raise pytest.UsageError(f"kvspec: {e}") from None
    opts = replace(plugin_options(pytestconfig), **{k: v for k, v in env.items() if k != "db"})
    return KVSpecFixture(opts, db)
