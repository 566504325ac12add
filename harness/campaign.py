"""``kvspec mutants``: run the catalogue of deliberate bugs as one campaign and print a table.

Each row is one mutant in one mode, fuzzed until the first finding (then reduced and written as a
report under ``--out``) or until ``--seconds`` pass: killed or not, which check killed it (the finding
kind, and the invariant or the equality field that fired), the time to the first failing example,
the time to the written report in this process (``report``) and from a cold start (``cold``: plus a
fresh process' start-up for the row's target, ``harness.run.startup``), and the trace's length before
the reduction (``shrunk``: Hypothesis shrinks only with ``--shrink-stall N``) and after it
(``harness.traces.reduce``, the report's length).  Exit 1 if any mutant survives.

Modes:

- ``exact`` / ``outcomes`` / ``invariants``: the mutant is the *target*, compared with the unmutated
  spec under that equality relation (``harness.core.equality``);
- ``self``: the *spec itself* is mutated, reference included, so nothing can diverge: only the
  invariants of ``spec.invariants`` (which keep the original code) can kill it.

Built-in catalogue (``harness.mutants.registry.all_mutants``, each ``Mutant`` in its ``modes``): the
spec mutants (``harness.mutants.spec``, ``harness.mutants.invariants``), the ``impl`` allocator
mutants (``harness.mutants.impl``) and, where vLLM is installed, runtime mutants of vLLM's
manager (``harness.mutants.vllm``) and of its real scheduler (``harness.mutants.vllm_scheduler``:
seeded runs of the real scheduler, no Hypothesis; the "shrunk" column is the recorded run).
``--target pkg.mod:factory`` runs a user's mutants instead:
``--mutants pkg.mod:mutants`` (default: ``mutants`` in the target's module) is a callable returning
``{name: factory}`` or ``{name: (factory, family)}``; each factory builds the user's target with one
bug; the unmutated target is fuzzed first as the control (a failing control is exit 2).

After the table: every check (the 29 invariants of ``spec.invariants.SPEC_INVARIANTS``, the event
replay ``events_replay``, and the equality relations' ``outcome`` and ``observation`` comparisons)
that killed no mutant.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvspec.harness.mutants.record import Mutant
    from kvspec.harness.run.catalogue import CatalogueEntry

from kvspec.harness.check.finding import check_of
from kvspec.harness.run.exits import EXIT_FOUND as EXIT_SURVIVED
from kvspec.harness.run.exits import EXIT_OK, EXIT_USAGE
from kvspec.harness.run.options import MutantsOptions, UsageError
from kvspec.harness.run.startup import cold_report_seconds

RELATION_CHECKS = ("outcome", "observation")


@dataclass(frozen=True)
class Entry:
    """One row of the campaign: a mutant, in one mode, in its families."""

    name: str
    origin: str  # spec | impl | vllm | scheduler | user
    mode: str  # exact | outcomes | invariants | self
    target: str  # as reports record it
    families: tuple[str, ...]
    factory: Callable[[], Any] | None = None  # None: the catalogue's target of that name (a built-in mutant)
    patch: Callable[[], AbstractContextManager[None]] | None = None  # active around the whole run (self mode)

    def catalogue_entry(self) -> CatalogueEntry:
        """The target the run loop drives: a built-in mutant as the catalogue resolves it (its driver
        included: vLLM's real scheduler for a scheduler mutant), any other row's factory under the
        lockstep driver."""
        from kvspec.harness.run.catalogue import manager_entry, resolve

        if self.factory is None:
            return resolve(self.target)
        return manager_entry(self.target, self.factory)

    @property
    def startup_target(self) -> str:
        """The target whose start-up a cold ``kvspec fuzz`` of this row pays: the built-in one its
        mutant patches, or the user's ``package.module:factory`` (less its ``#mutant``)."""
        builtin = {
            "spec": "spec",
            "impl": "impl",
            "vllm": "vllm",
            "scheduler": "vllm-scheduler",
            "engine": "vllm-engine",
        }
        return builtin.get(self.origin, self.target.split("#", 1)[0])


@dataclass
class Row:
    entry: Entry
    killed: bool
    check: str = ""
    first_failure: float | None = None
    to_report: float | None = None
    shrunk_steps: int | None = None  # after Hypothesis' shrinking
    reduced_steps: int | None = None  # after the trace reduction (harness/traces/reduce.py): the report's length
    report: Path | None = None
    note: str = ""
    cold: float | None = None  # to_report plus a fresh process' start-up for this target (harness.run.startup)


def add_parser(sub: Any) -> None:
    D = MutantsOptions  # the defaults (class attributes of the dataclass), so the two cannot drift
    from kvspec.harness.run.options import DefaultsShown

    what = "run the deliberate-bug catalogue as a campaign; exit 1 if a mutant survives"
    m = sub.add_parser("mutants", help=what, formatter_class=DefaultsShown)
    m.add_argument(
        "--target", default=D.target, help="pkg.module:factory: run that manager's own mutants (see --mutants)"
    )
    m.add_argument(
        "--mutants",
        default=D.mutants,
        help="pkg.module:callable returning {name: factory} (default: <target module>:mutants)",
    )
    m.add_argument(
        "--family", default=D.family, help="families of a user's mutants (comma-separated or 'all'; default full)"
    )
    m.add_argument(
        "--relation", default=D.relation, help="equality relation of a user's mutants (default: the target's own)"
    )
    m.add_argument(
        "--only", default=D.only, help="comma-separated mutant names (or origin:spec, origin:impl, origin:vllm)"
    )
    m.add_argument("--seconds", type=float, default=D.seconds, help="time budget per mutant (default 60)")
    m.add_argument("--shrink-seconds", type=int, default=D.shrink_seconds)
    m.add_argument("--shrink-stall", type=int, default=D.shrink_stall, help="as kvspec fuzz --shrink-stall (0: none)")
    m.add_argument(
        "--reduce-seconds",
        type=float,
        default=D.reduce_seconds,
        help="trace reduction bound (harness/traces/reduce.py)",
    )
    m.add_argument("--seed", type=int, default=D.seed)
    m.add_argument("--profile", default=D.profile)
    m.add_argument("--batch", type=int, default=D.batch, help="examples per family before rotating")
    m.add_argument("--step-timeout", type=float, default=D.step_timeout)
    m.add_argument("--use-db", action="store_true", help="use the example database (default: none, for honest timings)")
    m.add_argument("--out", default=D.out, help="where the killing reports go")
    m.add_argument("--no-vllm", action="store_true", help="leave out the runtime vLLM mutants")
    m.add_argument(
        "--control-seconds",
        type=float,
        default=D.control_seconds,
        help="how long the unmutated user target is fuzzed first",
    )


# --- the catalogue ---------------------------------------------------------------------------------


def builtin_entries(with_vllm: bool, with_engine: bool | None = None) -> list[Entry]:
    """One row per built-in mutant and mode (``harness.mutants.registry.all_mutants``); the runtime
    vLLM ones only ``with_vllm``, the engine-path ones also only ``with_engine`` (None: when there is
    an engine venv, ``ci/setup --engine``), SGLang's only when SGLang is there (``ci/setup --sglang``)."""
    from kvspec.harness.mutants.registry import all_mutants
    from kvspec.harness.sglang.load import is_sglang_there

    engines = with_vllm and (_engine_venv() if with_engine is None else with_engine)
    sglang = is_sglang_there()
    return [
        _entry(m, mode)
        for m in all_mutants()
        if (with_vllm or m.target not in ("vllm", "vllm-scheduler"))
        and (engines or m.target != "vllm-engine")
        and (sglang or m.target != "sglang")
        for mode in m.modes
    ]


def _engine_venv() -> bool:
    """Is there an engine venv for the engine-path mutants (``ci/setup --engine``)?"""
    from kvspec.harness.engine.driver import EngineUnavailable, engine_python

    try:
        engine_python()
    except EngineUnavailable:
        return False
    return True


def _entry(m: Mutant, mode: str) -> Entry:
    """The row of mutant ``m`` in ``mode``: in ``self`` mode the spec itself carries the bug; otherwise
    the catalogue's ``mutant:NAME`` target, resolved when the row runs."""
    from kvspec.harness.targets.spec import SpecTarget

    origin = {"vllm-scheduler": "scheduler", "vllm-engine": "engine"}.get(m.target, m.target)
    target, fams = f"mutant:{m.name}", (m.family,)
    if mode == "self":
        return Entry(m.name, origin, mode, target, fams, SpecTarget, patch=_self_patch(m.name))
    return Entry(m.name, origin, mode, target, fams)


def _self_patch(name: str) -> Callable[[], AbstractContextManager[None]]:
    from kvspec.harness.mutants.spec import patched_spec

    def patch() -> AbstractContextManager[None]:
        ctx: AbstractContextManager[None] = patched_spec(name, keep=("kvspec.spec.invariants",))
        return ctx

    return patch


def user_entries(target: str, mutants: str | None, families: tuple[str, ...], relation: str) -> list[Entry]:
    """The user's mutants (``UsageError``-style ``ValueError`` naming what is wrong)."""
    from kvspec.harness.targets import TargetLoadError, check_target
    from kvspec.harness.world.families import parse_families

    if ":" not in target:
        raise ValueError(f"--target {target!r}: expected package.module:factory")
    spec = mutants or f"{target.split(':', 1)[0]}:mutants"
    try:
        found = _load_callable(spec)()
    except TargetLoadError as e:
        raise ValueError(str(e)) from None
    except Exception as e:
        raise ValueError(f"--mutants {spec!r}: calling it raised {type(e).__name__}: {e}") from None
    if not isinstance(found, dict) or not found:
        raise ValueError(f"--mutants {spec!r}: expected a non-empty dict {{name: factory}}, got {type(found).__name__}")
    out = []
    for name, value in found.items():
        fams = families
        factory = value
        if isinstance(value, tuple) and len(value) == 2:
            factory, fam = value
            fams = tuple(parse_families(str(fam)))
        if not isinstance(name, str) or not callable(factory):
            raise ValueError(
                f"--mutants {spec!r}: entry {name!r} is not a name mapped to a factory (or (factory, family))"
            )
        try:
            check_target(factory, f"{target} mutant {name}")
        except TargetLoadError as e:
            raise ValueError(str(e)) from None
        out.append(Entry(name, "user", relation, f"{target}#{name}", fams, factory))
    return out


def _load_callable(spec: str) -> Callable[[], Any]:
    """``package.module:callable``, resolved exactly as ``--target`` is (``TargetLoadError`` says why not)."""
    from kvspec.harness.targets import TargetLoadError, user_factory

    try:
        return user_factory(spec)
    except TargetLoadError as e:
        raise TargetLoadError(str(e).replace("--target", "--mutants", 1)) from None


# --- running -----------------------------------------------------------------------------------------


def run_entry(entry: Entry, opts: MutantsOptions) -> Row:
    """One row: its mutant fuzzed by the one run loop (``harness.run.fuzzing.run_fuzz``) until the first
    finding or ``--seconds``; the finding reduced by the row's driver and written.  A scheduler mutant's
    run is vLLM's real scheduler with the bug patched in (no Hypothesis: the "shrunk" column holds the
    recorded run's length)."""
    from hypothesis import Verbosity

    from kvspec.harness.run.fuzzing import run_fuzz
    from kvspec.harness.run.supervise import supervised
    from kvspec.harness.traces.report import write_report
    from kvspec.harness.traces.trace import trace_from_json

    fuzz = opts.fuzz_options(entry.target, entry.families, "exact" if entry.mode == "self" else entry.mode)
    overrides: dict[str, Any] = {"verbosity": Verbosity.quiet}  # the table is the output, not Hypothesis' notes
    if not opts.use_db:
        overrides["database"] = None
    start = time.monotonic()
    with entry.patch() if entry.patch else nullcontext():
        target = entry.catalogue_entry()
        res = supervised(fuzz, lambda: run_fuzz(fuzz, target, settings_overrides=overrides), lambda: target)
    if res.trace is None:
        from kvspec.harness.run.finish import nothing_checked

        runs = "scheduler runs" if entry.origin == "scheduler" else f"examples, {res.steps} steps"
        note = f"stopped: {res.stopped}" if res.stopped else f"survived {res.examples} {runs}"
        if res.steps == 0 and not res.stopped:
            note = f"CHECKED NOTHING: {nothing_checked(res)}"
        return Row(entry, killed=False, note=note)
    report = write_report(opts.out, trace_from_json(res.trace))
    return Row(
        entry,
        True,
        check_of(res.trace["finding"]),
        res.first_finding_after,
        time.monotonic() - start,
        res.shrunk_steps,
        len(res.trace["steps"]),
        report,
    )


def select(entries: list[Entry], only: str | None) -> list[Entry]:
    if not only:
        return entries
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    known = {e.name for e in entries} | {f"origin:{e.origin}" for e in entries}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"--only: unknown mutant(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [e for e in entries if e.name in wanted or f"origin:{e.origin}" in wanted]


def all_checks() -> list[str]:
    from kvspec.spec.invariants import SPEC_INVARIANTS

    return [*SPEC_INVARIANTS, "events_replay", *RELATION_CHECKS]


def uncovered(rows: list[Row]) -> list[str]:
    """The checks that killed no mutant (the relations count under their own name)."""
    fired = set()
    for r in rows:
        if r.killed:
            detail = r.check.split(": ", 1)[-1]
            fired.add(detail.split("/", 1)[0])
    return [c for c in all_checks() if c not in fired]


def render_table(rows: list[Row]) -> Iterator[str]:
    head = (
        "mutant",
        "origin",
        "mode",
        "family",
        "killed",
        "killed by",
        "1st failure",
        "report",
        "cold",
        "shrunk",
        "reduced",
    )
    cells = [
        (
            r.entry.name,
            r.entry.origin,
            r.entry.mode,
            ",".join(r.entry.families),
            "yes" if r.killed else "NO",
            r.check or r.note,
            _secs(r.first_failure),
            _secs(r.to_report),
            _secs(r.cold),
            "-" if r.shrunk_steps is None else f"{r.shrunk_steps} steps",
            "-" if r.reduced_steps is None else f"{r.reduced_steps} steps",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *cells)]
    for line in (head, tuple("-" * w for w in widths), *cells):
        yield "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


def mutants_cmd(opts: MutantsOptions) -> int:
    """``kvspec mutants``, its options already checked (``MutantsOptions.from_namespace``)."""
    from kvspec.harness.world.families import parse_families

    try:
        if opts.target is not None:
            target = opts.target
            opts, relation = _with_relation(opts, target)
            entries = user_entries(target, opts.mutants, tuple(parse_families(opts.family)), relation)
        else:
            entries = builtin_entries(with_vllm=not opts.no_vllm and _has_vllm())
        entries = select(entries, opts.only)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if opts.target is not None and not _control_passes(opts, opts.target, entries):
        return EXIT_USAGE
    rows = []
    startups: dict[str, float | None] = {}
    for entry in entries:
        print(
            f"kvspec mutants: {entry.origin} {entry.name} ({entry.mode}, {','.join(entry.families)}) ...",
            file=sys.stderr,
            flush=True,
        )
        row = run_entry(entry, opts)
        if row.to_report is not None:
            row.cold = cold_report_seconds(row.to_report, entry.startup_target, startups)
        rows.append(row)
    for line in render_table(rows):
        print(line)
    killed = sum(r.killed for r in rows)
    print(f"\nkvspec mutants: {killed}/{len(rows)} killed; reports under {opts.out}")
    times = sorted(r.to_report for r in rows if r.to_report is not None)
    if times:
        print(f"start to report (in this process): median {statistics.median(times):.1f}s, worst {times[-1]:.1f}s")
    cold = sorted(r.cold for r in rows if r.cold is not None)
    if cold:
        ups = ", ".join(f"{t} {s:.1f}s" for t, s in sorted(startups.items()) if s is not None)
        print(
            f"start to report from a cold start: median {statistics.median(cold):.1f}s, worst {cold[-1]:.1f}s "
            f"(a fresh process' start-up before its first example: {ups})"
        )
    if opts.target is None and not opts.only:
        rest = uncovered(rows)
        print(f"checks that killed no mutant ({len(rest)} of {len(all_checks())}): {', '.join(rest) or 'none'}")
    return EXIT_OK if killed == len(rows) else EXIT_SURVIVED


def _with_relation(opts: MutantsOptions, target: str) -> tuple[MutantsOptions, str]:
    """``opts`` under the relation in force for the user's ``target`` (said on stderr, with why)."""
    from dataclasses import replace

    from kvspec.harness.run.catalogue import resolve
    from kvspec.harness.run.relation_choice import choose_relation
    from kvspec.harness.targets import TargetLoadError

    try:
        choice = choose_relation(opts.relation, resolve(target))
    except TargetLoadError as e:
        raise ValueError(str(e)) from None
    print(f"kvspec mutants: {choice.line()}", file=sys.stderr, flush=True)
    return replace(opts, relation=choice.relation), choice.relation


def _control_passes(opts: MutantsOptions, target: str, entries: list[Entry]) -> bool:
    """The unmutated user target must survive the same families for a short while."""
    from kvspec.harness.run.catalogue import resolve

    fams = tuple(sorted({f for e in entries for f in e.families}))
    control = Entry("(control)", "user", opts.relation or "exact", target, fams, resolve(target).factory)
    row = run_entry(control, opts.control())
    if row.killed:
        print(
            f"kvspec mutants: the unmutated target {target} already fails ({row.check}; report {row.report}): "
            "fix it (or pick --family / --relation) before judging its mutants",
            file=sys.stderr,
        )
    return not row.killed


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True
