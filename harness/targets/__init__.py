"""Targets: one small adapter per KV-cache manager, all behind ``harness.targets.base.Target``.

``load_target(name)`` resolves ``--target``:
- ``spec``: the model itself (``harness.targets.spec``);
- ``vllm``: the installed vLLM release's ``KVCacheManager``, any of 0.23.0 to 0.34.0 (imported lazily, it
  is slow and optional; ``harness.targets.vllm_release`` picks the release's profile);
- ``impl``: kvspec's own fast allocator (lazily);
- ``package.module:factory``: a user's adapter; ``factory()`` must return an object satisfying the
  protocol (see docs/targets.md).
Every failure raises ``TargetLoadError`` with a message saying why (the CLI exits 2 on it).
This registry holds production targets only: the deliberate bugs (``mutant:NAME``) live in
``harness.mutants.registry`` and are resolved by the CLI (``harness.mutants.registry.resolve_target``).

Imports: harness, harness.core, spec, impl.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from harness.targets.base import Target, Unsupported

__all__ = [
    "Target",
    "TargetLoadError",
    "Unsupported",
    "check_target",
    "is_builtin",
    "load_target",
    "target_factory",
]

BUILTIN = ("spec", "vllm", "impl")


class TargetLoadError(Exception):
    """``--target`` names something that cannot be loaded; the message says why."""


def _check_protocol(obj: object, what: str) -> Target:
    missing = [m for m in ("name", "version", "reset", "apply", "observe") if not hasattr(obj, m)]
    if missing:
        raise TargetLoadError(
            f"{what} returned {type(obj).__name__}, which lacks {', '.join(missing)} (see docs/targets.md)"
        )
    for m in ("reset", "apply", "observe"):
        if not callable(getattr(obj, m)):
            raise TargetLoadError(f"{what}: {m} is not callable")
    return obj  # type: ignore[return-value]


def _builtin(name: str) -> Callable[[], Target]:
    if name == "spec":
        from harness.targets.spec import SpecTarget

        return SpecTarget
    if name == "vllm":
        try:
            import vllm  # noqa: F401
        except Exception as e:  # ImportError, or a broken install
            raise TargetLoadError(
                f"target 'vllm' needs vLLM installed (ci/setup --vllm[=VERSION]): {type(e).__name__}: {e}"
            ) from None
        try:
            mod = importlib.import_module("harness.targets.vllm")
        except Exception as e:
            raise TargetLoadError(f"target 'vllm': the adapter failed to import: {type(e).__name__}: {e}") from None
        return _factory_from_module(mod, "vllm")
    if name == "impl":
        try:
            mod = importlib.import_module("harness.targets.impl")
        except Exception as e:
            raise TargetLoadError(f"target 'impl': the adapter failed to import: {type(e).__name__}: {e}") from None
        return _factory_from_module(mod, "impl")
    raise AssertionError(name)


def _factory_from_module(mod: object, name: str) -> Callable[[], Target]:
    for attr in ("make_target", "Target", f"{name.capitalize()}Target", "VLLMTarget", "ImplTarget"):
        f = getattr(mod, attr, None)
        if callable(f) and attr != "Target":
            return f  # type: ignore[no-any-return]
    raise TargetLoadError(f"target {name!r}: module {getattr(mod, '__name__', mod)} defines no make_target()")


def is_builtin(name: str) -> bool:
    """Is ``name`` one of this registry's own targets (no module named by ``name`` is imported)?"""
    return name in BUILTIN


def target_factory(name: str) -> Callable[[], Target]:
    """Resolve ``name`` to a zero-argument factory of fresh targets (checked once here)."""
    if is_builtin(name):
        factory = _builtin(name)
    elif ":" in name:
        factory = _user_factory(name)
    else:
        raise TargetLoadError(f"unknown target {name!r}: use spec, vllm, impl or package.module:factory")
    check_target(factory, name)
    return factory


def check_target(factory: Callable[[], Target], name: str) -> None:
    """Build one target with ``factory`` and check it has the protocol's parts (raises ``TargetLoadError``)."""
    _check_protocol(_call_factory(factory, name), f"target {name!r}")


def _user_factory(name: str) -> Callable[[], Target]:
    """Import ``package.module`` and return its ``factory``.  Like ``python -m``, the current folder
    goes on ``sys.path`` first: a console script (``kvspec``) does not put it there, and a target
    such as ``examples.my_manager:make_target`` must load from the folder it is named in."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise TargetLoadError(f"--target {name!r}: expected package.module:factory")
    cwd = os.getcwd()
    if all(os.path.abspath(p) != cwd for p in sys.path):
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise TargetLoadError(f"--target {name!r}: module {e.name!r} not found (is it on PYTHONPATH?)") from None
    except Exception as e:
        raise TargetLoadError(f"--target {name!r}: importing {module_name} raised {type(e).__name__}: {e}") from None
    obj: object = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetLoadError(f"--target {name!r}: module {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetLoadError(f"--target {name!r}: {attr} is not callable")
    return obj


def _call_factory(factory: Callable[[], Target], name: str) -> Target:
    try:
        return factory()
    except TargetLoadError:
        raise
    except Exception as e:
        raise TargetLoadError(f"target {name!r}: its factory raised {type(e).__name__}: {e}") from None


def load_target(name: str) -> Target:
    """One fresh target for ``--target name``; ``TargetLoadError`` says why it cannot be loaded."""
    factory = target_factory(name)
    return _check_protocol(_call_factory(factory, name), f"target {name!r}")
