"""vLLM's ``KVCacheManager`` with ``__init__`` and ``allocate_slots`` behind wrappers that show only
``*args, **kwargs``, as instrumentation and plugins write them (tests/hostile/test_silent_green.py).

``opaque`` wrappers call the original through a table, so nothing but the call reveals what it takes;
``closing`` wrappers close over the original function (no ``functools.wraps``).
"""

from __future__ import annotations

import os
from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheManager

_ORIGINAL = {"__init__": KVCacheManager.__init__, "allocate_slots": KVCacheManager.allocate_slots}


def _opaque(name: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _ORIGINAL[name](*args, **kwargs)

    return wrapper


def _closing(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper.__name__ = fn.__name__
    return wrapper


if os.environ.get("KVSPEC_WRAP", "opaque") == "opaque":
    KVCacheManager.__init__ = _opaque("__init__")  # type: ignore[method-assign]
    KVCacheManager.allocate_slots = _opaque("allocate_slots")  # type: ignore[method-assign]
else:
    KVCacheManager.__init__ = _closing(_ORIGINAL["__init__"])  # type: ignore[method-assign]
    KVCacheManager.allocate_slots = _closing(_ORIGINAL["allocate_slots"])  # type: ignore[method-assign]


def factory() -> Any:
    from kvspec.harness.targets.vllm import VllmTarget

    return VllmTarget()
