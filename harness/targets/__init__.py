"""Targets: one small adapter per KV-cache manager, all behind ``harness.targets.base.Target``.

- ``spec``: the model itself; ``vllm``: the installed vLLM release's ``KVCacheManager``, any of
  0.23.0 to 0.34.0 (``vllm_release`` probes the release's API and picks its profile); ``impl``:
  kvspec's own fast allocator; ``adapter``: what the vLLM-like adapters share;
- ``outcome_schema``: the forms a target's outcomes and observations must have;
- here: ``user_factory`` (a user's ``package.module:factory``, imported as ``python -m`` would),
  ``check_target`` (a factory builds an object with the protocol's parts), ``TargetLoadError``.

Which name is which target, and which driver runs it, is the target catalogue's
(``harness.run.catalogue.resolve``, the one resolver); this folder only adapts managers.

Imports: harness, harness.core, spec, impl.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from kvspec.harness.targets.base import Target, Unsupported

__all__ = ["Target", "TargetLoadError", "Unsupported", "check_target", "user_factory"]


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


def check_target(factory: Callable[[], Target], name: str) -> None:
    """Build one target with ``factory`` and check it has the protocol's parts (raises ``TargetLoadError``)."""
    _check_protocol(_call_factory(factory, name), f"target {name!r}")


def user_factory(name: str) -> Callable[[], Target]:
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
