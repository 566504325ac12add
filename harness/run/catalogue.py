"""The target catalogue: what ``--target X`` names, resolved in one function, ``resolve``.

Every way in (``kvspec fuzz``, ``kvspec replay``, ``kvspec mutants``, the workers, the pytest plugin,
the reports' pytest files) turns a name into one ``CatalogueEntry``: the factory of fresh targets,
the **driver** that runs it (``harness.drivers``: the manager lockstep, or vLLM's real scheduler), the
relation it is compared under by default and why, the families it models, what its start-up does,
and its origin.  Names follow ``harness.core.target_names``:

- the built-in targets, here and nowhere else (``BUILTIN``): ``spec``, ``vllm``, ``impl``,
  ``vllm-fixed`` (vLLM with the proposed fixes of K1 and K3), ``vllm-scheduler`` (vLLM's real scheduler
  driving its manager), ``vllm-engine`` (real engines on tiny models, ``harness.engine``), ``sglang``
  (SGLang's radix cache, ``harness.sglang``);
- ``mutant:NAME``: a deliberate bug of any catalogue (``harness.mutants.registry.all_mutants``), run
  by the driver of the kind of target it mutates;
- ``package.module:factory``: a user's manager (``harness.targets.user_factory``), lockstep-driven.

``replay_target`` picks the target a recorded trace is replayed on: a trace file never chooses code to
run.  ``python -m kvspec.harness.run.catalogue NAME`` does what a run of NAME does before its first example
(``harness.run.startup`` times it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.core.target_names import MUTANT_PREFIX, is_user_target
from kvspec.harness.drivers.base import DriveHooks, Driver, DriveSettings
from kvspec.harness.drivers.lockstep import LockstepDriver
from kvspec.harness.run.options import FuzzOptions
from kvspec.harness.targets import TargetLoadError, check_target, user_factory

if TYPE_CHECKING:
    from kvspec.harness.traces.replay import ReplayResult
    from kvspec.harness.traces.trace import Trace

DriverMaker = Callable[[Callable[[], Any], DriveSettings, DriveHooks], Driver]


@dataclass(frozen=True)
class CatalogueEntry:
    """One target as a run needs it (module docstring).  ``relation`` None: the target's own
    declaration decides (``harness.run.relation_choice``), and likewise ``engine`` (the policy
    invariants in force, ``spec.invariants``); ``families`` None: it models every family;
    ``origin``: the kind of target (``spec``, ``impl``, ``vllm``, ``scheduler``, ``user``)."""

    name: str
    factory: Callable[[], Any]
    driver: DriverMaker = LockstepDriver
    relation: str | None = None
    relation_reason: str = ""
    families: tuple[str, ...] | None = None
    origin: str = "user"
    warm_up: Callable[[CatalogueEntry], None] | None = None
    engine: str | None = None  # whose policy invariants are in force; None: the target's own ``engine``

    @property
    def builtin(self) -> bool:
        """Resolved by lookup alone (no user code imported)."""
        return not is_user_target(self.name)

    @property
    def one_process(self) -> bool:
        """Its driver runs in one process only (no ``--workers``)."""
        return bool(getattr(self._driver_class, "one_process", False))

    @property
    def kv_check(self) -> bool:
        """Its driver can wrap the targets in the KV-content oracle (``--kv-check``)."""
        return bool(getattr(self._driver_class, "kv_check", True))

    @property
    def _driver_class(self) -> Any:
        return getattr(self.driver, "func", self.driver)  # a functools.partial of a driver class, or the class

    def make_driver(self, settings: DriveSettings, hooks: DriveHooks | None = None) -> Driver:
        return self.driver(self.factory, settings, hooks or DriveHooks())

    def replay(self, trace: Trace, where: str, checks: CheckSettings = DEFAULT_CHECKS) -> ReplayResult:
        """``trace`` re-run the way this target's driver made it (``Driver.replay``)."""
        driver = self.make_driver(DriveSettings(target=self.name, checks=checks))
        driver.check_trace(trace, where)
        return driver.replay(trace, where)


def resolve(name: str, assume_release: str | None = None) -> CatalogueEntry:
    """The catalogue entry ``--target name`` names, its target built once and checked; ``TargetLoadError``
    saying why when it cannot be (also when loading it raises, even ``SystemExit``).
    ``assume_release``: the known vLLM release to model an unknown installed one as
    (``KVSPEC_VLLM_PROFILE``, read by the caller)."""
    try:
        if name.startswith(MUTANT_PREFIX):
            return _mutant_entry(name, assume_release)
        if name in BUILTIN:
            return BUILTIN[name](assume_release)
        if is_user_target(name):
            factory = user_factory(name)
            check_target(factory, name)
            return CatalogueEntry(name, factory)
    except (TargetLoadError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit from a user's module or factory must not end kvspec
        raise TargetLoadError(f"target {name!r}: loading it raised {type(e).__name__}: {e}") from None
    from kvspec.harness.world.families import did_you_mean

    hint = did_you_mean(name, BUILTIN)
    raise TargetLoadError(
        f"unknown target {name!r}{hint} (use {', '.join(BUILTIN)}, mutant:NAME or package.module:factory)"
    )


def fuzz_target(opts: FuzzOptions) -> CatalogueEntry:
    """The entry a run of ``opts`` drives: ``--target`` resolved (``resolve``), its targets wrapped in
    the KV-content oracle with ``--kv-check`` (when its driver can; otherwise ``--kv-check`` is ignored,
    and the caller says so)."""
    entry = resolve(opts.target, opts.assume_release)
    if not opts.kv_check or not entry.kv_check:
        return entry
    return with_kv_check(entry, known_bugs=not opts.strict_known)


def with_kv_check(entry: CatalogueEntry, known_bugs: bool = True) -> CatalogueEntry:
    """``entry`` with its targets wrapped in the KV-content oracle (``--kv-check``; ``known_bugs``: the
    oracle stops checking a run at a known target bug instead of reporting its numbers)."""
    from kvspec.harness.oracle.target import KVCheckTarget

    inner = entry.factory

    def checked() -> Any:
        return KVCheckTarget(inner(), known_bugs=known_bugs)

    checked.declined_families = getattr(inner, "declined_families", None)  # type: ignore[attr-defined]
    return replace(entry, factory=checked)


def manager_entry(name: str, factory: Callable[[], Any], relation: str | None = None) -> CatalogueEntry:
    """A manager target that is in no catalogue (``releases diff``'s spec under a profile, a test's own
    factory), run by the lockstep driver."""
    return CatalogueEntry(name, factory, relation=relation, relation_reason="given by the caller")


# --- the built-in targets ------------------------------------------------------------------------

EXACT_WHY = "{} models vLLM block for block; the default for it"


def _spec(assume_release: str | None) -> CatalogueEntry:
    from kvspec.harness.targets.spec import SpecTarget

    return _checked(
        CatalogueEntry("spec", SpecTarget, relation="exact", relation_reason=EXACT_WHY.format("spec"), origin="spec")
    )


IMPL_WHY = "impl models vLLM block for block and refuses the inputs of known bugs K1-K3; the default for it"


def _impl(assume_release: str | None) -> CatalogueEntry:
    """kvspec's allocator: vLLM 0.33 block for block, except that where 0.33 reads the null block (K1-K3)
    it refuses the config or call (``impl.allocator.refusals``) and the run discards that example."""
    factory = _import_factory("impl", "kvspec.harness.targets.impl", "ImplTarget")
    return _checked(CatalogueEntry("impl", factory, relation="exact", relation_reason=IMPL_WHY, origin="impl"))


def _vllm(assume_release: str | None) -> CatalogueEntry:
    _need_vllm("vllm")
    target: Any = _import_factory("vllm", "kvspec.harness.targets.vllm", "VllmTarget")
    factory = partial(target, assume_release=assume_release) if assume_release else target
    return _checked(
        CatalogueEntry("vllm", factory, relation="exact", relation_reason=EXACT_WHY.format("vllm"), origin="vllm")
    )


def _vllm_fixed(assume_release: str | None) -> CatalogueEntry:
    _vllm(assume_release)  # says why when vLLM is not installed
    from kvspec.harness.mutants.fixes_vllm import make_target

    why = "vllm-fixed carries proposed fixes, so it differs from vLLM by design"
    return _checked(
        CatalogueEntry("vllm-fixed", make_target, relation="invariants", relation_reason=why, origin="vllm")
    )


def _scheduler(assume_release: str | None, name: str = "vllm-scheduler", mutant: str | None = None) -> CatalogueEntry:
    """vLLM's real scheduler driving its own manager (``mutant``: a deliberate scheduler bug patched in
    for the run).  It runs the releases kvspec knows only: ``assume_release`` does not apply."""
    from kvspec.harness.vllm_sched.driver import SCHED_FAMILIES
    from kvspec.harness.vllm_sched.fuzz import SchedulerDriver

    _need_vllm(name)
    from kvspec.harness.targets.vllm import VllmUnavailable
    from kvspec.harness.targets.vllm import _vllm as load_vllm

    try:
        load_vllm()
    except VllmUnavailable as e:
        raise TargetLoadError(f"target {name!r}: {e}") from None
    return CatalogueEntry(
        name,
        _no_factory,
        partial(SchedulerDriver, mutant=mutant),
        relation="exact",
        relation_reason=EXACT_WHY.format(name),
        families=tuple(SCHED_FAMILIES),
        origin="scheduler",
        warm_up=_warm_up_scheduler,
    )


def _engine(assume_release: str | None, name: str = "vllm-engine", mutant: str | None = None) -> CatalogueEntry:
    """Real vLLM engines on tiny models, every engine check on (``harness.engine``), run in the engine
    venv (``ci/setup --engine``); ``mutant``: a deliberate engine-path bug in the worker."""
    from kvspec.harness.engine.driver import EngineDriver, EngineUnavailable, engine_python
    from kvspec.harness.engine.workload import ENGINE_FAMILIES

    try:
        engine_python()
    except EngineUnavailable as e:
        raise TargetLoadError(f"target {name!r}: {e}") from None
    return CatalogueEntry(
        name,
        _no_engine_factory,
        partial(EngineDriver, mutant=mutant),
        relation="exact",
        relation_reason=EXACT_WHY.format(name),
        families=ENGINE_FAMILIES,
        origin="engine",
    )


def _sglang(assume_release: str | None, name: str = "sglang") -> CatalogueEntry:
    """SGLang's radix cache (``harness.sglang``), from the sglang venv (``ci/setup --sglang``): another
    engine, held to the engine-neutral invariants, SGLang's own and the KV ledger."""
    from kvspec.harness.sglang.load import SglangUnavailable, load_sglang

    try:
        load_sglang()
    except SglangUnavailable as e:
        raise TargetLoadError(f"target {name!r}: {e}") from None
    factory = _import_factory(name, "kvspec.harness.sglang.target", "SglangTarget")
    return _checked(CatalogueEntry(name, factory, origin="sglang", engine="sglang"))


def _no_engine_factory() -> Any:
    raise TargetLoadError("a real engine drives vLLM's own manager: it has no target factory to call")


BUILTIN: dict[str, Callable[[str | None], CatalogueEntry]] = {
    "spec": _spec,
    "vllm": _vllm,
    "impl": _impl,
    "vllm-fixed": _vllm_fixed,
    "vllm-scheduler": _scheduler,
    "vllm-engine": _engine,
    "sglang": _sglang,
}


def _mutant_entry(name: str, assume_release: str | None) -> CatalogueEntry:
    """``mutant:NAME``: the deliberate bug's target, run by the driver of the kind it mutates."""
    from kvspec.harness.mutants.registry import all_mutants, find_mutant, mutant_factory

    mutant = find_mutant(name[len(MUTANT_PREFIX) :])
    if mutant is None:
        from kvspec.harness.world.families import did_you_mean

        names = sorted(m.name for m in all_mutants())
        given = name[len(MUTANT_PREFIX) :]
        raise TargetLoadError(f"unknown mutant {given!r}{did_you_mean(given, names)} (known: {', '.join(names)})")
    if mutant.target == "vllm-scheduler":
        return _scheduler(assume_release, name, mutant.name)
    if mutant.target == "vllm-engine":
        return _engine(assume_release, name, mutant.name)
    if mutant.target == "sglang":
        _sglang(assume_release)  # says why when SGLang is not there
        return _checked(CatalogueEntry(name, mutant_factory(mutant), origin="sglang", engine="sglang"))
    if mutant.target == "vllm":
        _vllm(assume_release)  # says why when vLLM is not installed
    entry = CatalogueEntry(name, mutant_factory(mutant), relation="exact", relation_reason=EXACT_WHY.format(name))
    return _checked(replace(entry, origin=mutant.target))


def _checked(entry: CatalogueEntry) -> CatalogueEntry:
    check_target(entry.factory, entry.name)
    return entry


def _need_vllm(name: str) -> None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        raise TargetLoadError(
            f"target {name!r} needs vLLM installed (ci/setup --vllm[=VERSION]): {type(e).__name__}: {e}"
        ) from None


def _import_factory(name: str, module: str, attr: str) -> Callable[[], Any]:
    import importlib

    try:
        factory: Callable[[], Any] = getattr(importlib.import_module(module), attr)
    except Exception as e:
        raise TargetLoadError(f"target {name!r}: the adapter failed to import: {type(e).__name__}: {e}") from None
    return factory


def _no_factory() -> Any:
    raise TargetLoadError("vLLM's real scheduler drives vLLM's own manager: it has no target factory to call")


# --- replay ----------------------------------------------------------------------------------------


class UntrustedTarget(Exception):
    """A trace records a ``package.module:factory`` target and the user chose none (exit 2)."""


def replay_target(trace: Trace, path: str | Path, target: str | None, trust: bool) -> str:
    """The target to replay ``trace`` (read from ``path``) on: ``target`` (``--target``) if given;
    else the recorded one if it is built in, or if ``trust`` (``--trust-trace-target``)."""
    if target:
        return target
    if trust or not is_user_target(trace.target_name):
        return trace.target_name
    raise UntrustedTarget(
        f"{path}: the trace records target {trace.target_name!r}, which is not a built-in target "
        f"({', '.join(BUILTIN)}, mutant:NAME) but code to import and call; a trace file does not choose code "
        "to run. Choose the target with --target X (e.g. --target spec), or, if you trust this file, "
        "use its recorded target with --trust-trace-target"
    )


def replay_recorded(trace: Trace, where: str, target: str | None = None, strict_known: bool = False) -> ReplayResult:
    """``trace`` replayed on ``target`` (default: its recorded, built-in one) by that target's driver:
    what a report's pytest file runs (``strict_known``: a known target bug fails it too, as the
    pytest file of a known bug's report asks)."""
    entry = resolve(replay_target(trace, where, target, trust=False))
    return entry.replay(trace, where, replace(DEFAULT_CHECKS, strict_known=strict_known))


# --- start-up --------------------------------------------------------------------------------------


def warm_up(name: str) -> None:
    """What a run of ``--target name`` does before its first example: resolve and build the target,
    reset it on a first config, build the state machines (or, for vLLM's real scheduler, one scheduler)."""
    entry = resolve(name)
    (entry.warm_up or _warm_up_lockstep)(entry)


def _warm_up_lockstep(entry: CatalogueEntry) -> None:
    from kvspec.harness.check.machine import RunStats, make_machine
    from kvspec.harness.world.families import FAMILIES
    from kvspec.spec.config import KVCacheConfig, full_attention
    from kvspec.spec.types import BlockCount, TokenCount

    entry.factory().reset(KVCacheConfig(BlockCount(16), (full_attention(16),), TokenCount(256)))
    for family in FAMILIES:
        make_machine(family, entry.factory, entry.name, CheckSettings(), RunStats())


def _warm_up_scheduler(entry: CatalogueEntry) -> None:
    from kvspec.harness.vllm_sched.build import SchedKnobs, build_scheduler
    from kvspec.spec.config import KVCacheConfig, full_attention
    from kvspec.spec.types import BlockCount, TokenCount

    build_scheduler(KVCacheConfig(BlockCount(64), (full_attention(16),), TokenCount(256)), SchedKnobs())


if __name__ == "__main__":
    warm_up(sys.argv[1])
