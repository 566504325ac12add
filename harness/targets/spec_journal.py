"""Spec manager calls shared by two ``SpecTarget``\\s that make the same calls.

``kvspec fuzz --target vllm-scheduler`` runs the spec twice per engine step: the lockstep's reference
(``harness.check.lockstep``), fed the real scheduler's calls, and the spec behind kvspec's scheduler
model (``harness.vllm_sched.mirror``), fed the model's calls, which are the same ones while the two
schedulers agree.  Every manager function of ``spec.kv_cache_manager`` is a pure function of
immutable values (a state, a ``Request``, ints), so a call on the very same state object with equal
arguments returns what the first such call returned: a ``SpecJournal`` given to both targets
(``SpecTarget.journal``) keeps each call's result and hands it to the second caller instead of
computing it again.  A call on another state, or with any argument different, is computed as usual,
so what either target returns never changes; ``clear`` forgets the calls (each engine step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Entry = tuple[Any, tuple[Any, ...], dict[str, Any], Any]  # (state, arguments, keyword arguments, result)


class SpecJournal:
    """The results of the spec calls made since the last ``clear``, by function and state identity."""

    def __init__(self) -> None:
        self._calls: dict[tuple[Callable[..., Any], int], list[Entry]] = {}
        self.hits = 0  # calls answered from the journal
        self.misses = 0  # calls computed

    def clear(self) -> None:
        self._calls.clear()

    def call(self, fn: Callable[..., Any], state: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(state, *args, **kwargs)``: the result of an earlier call on ``state`` itself (an entry
        holds its state, so the id is not reused while it lives) with equal arguments, else computed."""
        key = (fn, id(state))
        entries = self._calls.get(key)
        if entries is not None:
            for s, a, k, result in entries:
                if s is state and a == args and k == kwargs:
                    self.hits += 1
                    return result
        result = fn(state, *args, **kwargs)  # a call that raises is not kept
        self.misses += 1
        self._calls.setdefault(key, []).append((state, args, kwargs, result))
        return result


__all__ = ["SpecJournal"]
