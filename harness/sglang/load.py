"""Where SGLang comes from, and the one place that makes it import and run on a CPU.

SGLang lives in its own light venv (``ci/setup --sglang``: ``<venv>-sglang``, or the venv named by
``KVSPEC_SGLANG_VENV``), on top of kvspec's: the same interpreter and torch, plus SGLang and the few
packages its cache modules import.  ``load_sglang`` puts that venv's site-packages after this
process's own on ``sys.path`` (so nothing kvspec already imported is shadowed), installs the shims
below, and imports the modules the target drives.  Where SGLang is importable already, it is used
as it is.

The shims, each standing in for one piece of SGLang that needs an accelerator or a CUDA-only package:

- ``torchvision``: SGLang's config package imports it for multimodal processors the cache never
  runs; PyPI's wheel is a CUDA build that fails beside CPU torch, so the venv leaves it out and
  ``_TorchvisionStub`` answers the import with a module whose every callable says it is absent.
  The stub lives only while SGLang's modules load (``SGLANG_MODULES``), then leaves ``sys.modules``,
  so nothing else in the process sees a torchvision.

Nothing else needs a shim on this path in 0.5.23: with ``SGLANG_USE_CPU_ENGINE`` unset SGLang reports
no Triton, so its paged allocator and row writes take their plain-torch paths, and the one
Triton-only helper (``allocation.get_last_loc``) serves speculative decoding, which is not driven.

Imports: stdlib only (SGLang itself, lazily).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

ENV_SGLANG_VENV = "KVSPEC_SGLANG_VENV"


class SglangUnavailable(Exception):
    """SGLang cannot be loaded here; the message says how to get it."""


class _Absent:
    """What the torchvision stub hands out: any attribute is another ``_Absent``, a call says why."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is not installed in kvspec's sglang venv (ci/setup --sglang)")


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision[.x]`` when no real torchvision is installed (module docstring)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torchvision" and not name.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]  # read by transformers' availability checks

        def absent(attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Absent(f"{spec.name}.{attr}")

        module.__getattr__ = absent  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def sglang_site() -> Path | None:
    """The sglang venv's site-packages: ``KVSPEC_SGLANG_VENV``, else ``<this venv>-sglang``; None when
    SGLang is importable here already.  ``SglangUnavailable`` when neither."""
    named = os.environ.get(ENV_SGLANG_VENV)
    venv = Path(named) if named else Path(sys.prefix + "-sglang")
    if named and not (venv / "bin" / "python").is_file():
        raise SglangUnavailable(f"{ENV_SGLANG_VENV}={named} is not a venv (make one with: bash ci/setup --sglang)")
    if (venv / "bin" / "python").is_file():
        return Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    if importlib.util.find_spec("sglang") is not None:
        return None
    raise SglangUnavailable(
        f"the sglang target needs SGLang: `bash ci/setup --sglang` makes {sys.prefix}-sglang (SGLang 0.5.23, "
        f"CPU, on top of this venv), or name a venv with {ENV_SGLANG_VENV}"
    )


SGLANG_MODULES = (
    "sglang.srt.server_args",
    "sglang.srt.runtime_context",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.unified_cache.components",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core",
    "sglang.srt.mem_cache.unified_radix_cache",
)
"""Every SGLang module the target and its mutants use, imported while the stub is in place."""


def is_sglang_there() -> bool:
    """Is there an SGLang to load (its venv, or SGLang importable here)?  Nothing is imported."""
    try:
        sglang_site()
    except SglangUnavailable:
        return False
    return True


_LOADED: dict[str, Any] = {}


def load_sglang() -> dict[str, Any]:
    """SGLang's ``version``, its modules imported (``SGLANG_MODULES``) once per process with the shims
    in place (module docstring); ``SglangUnavailable`` saying why when it cannot be."""
    if _LOADED:
        return _LOADED
    site = sglang_site()
    if site is not None and str(site) not in sys.path:
        sys.path.append(str(site))
    stub = _TorchvisionStub() if importlib.util.find_spec("torchvision") is None else None
    if stub is not None:
        sys.meta_path.insert(0, stub)
    try:
        for name in SGLANG_MODULES:
            importlib.import_module(name)
    except Exception as e:
        raise SglangUnavailable(f"SGLang failed to import: {type(e).__name__}: {e}") from None
    finally:
        if stub is not None:
            sys.meta_path.remove(stub)
            for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
                del sys.modules[name]
    _LOADED["version"] = sys.modules["sglang"].__version__
    return _LOADED
