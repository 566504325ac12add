"""Drive two targets through the same seeded workload and report the first divergence."""

from __future__ import annotations

from typing import Any

from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig


class Diverged(Exception):
    """The two targets answered one operation differently, or reported different states."""


class _Pair:
    """Applies each operation to ``a`` and ``b``; the workload goes on with ``a``'s outcome."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b
        self.applied = 0

    def reset(self, config: KVCacheConfig) -> None:
        self.a.reset(config)
        self.b.reset(config)

    def apply(self, op: Any) -> Any:
        self.applied += 1
        ra, rb = _outcome(self.a, op), _outcome(self.b, op)
        if ra != rb:
            raise Diverged(f"op #{self.applied} {op}: outcome {ra!r} != {rb!r}")
        if isinstance(ra, tuple):
            raise Diverged(f"op #{self.applied} {op}: both raised {ra[1]}")
        oa, ob = self.a.observe(), self.b.observe()
        if oa != ob:
            fields = [f for f in oa.__dataclass_fields__ if getattr(oa, f) != getattr(ob, f)]
            va, vb = [getattr(oa, f) for f in fields], [getattr(ob, f) for f in fields]
            raise Diverged(f"op #{self.applied} {op}: observations differ in {fields}: {va} vs {vb}")
        return ra

    def observe(self) -> Any:
        return self.a.observe()


def run_both(a: Any, b: Any, config: KVCacheConfig, seed: int, actions: int) -> tuple[int, str | None]:
    """Drive ``a`` and ``b`` through one seeded workload run of ``actions`` actions; return
    (operations applied, the first difference or None)."""
    pair = _Pair(a, b)
    try:
        run_seeded(pair, config, seed, actions)
    except Diverged as e:
        return pair.applied, str(e)
    return pair.applied, None


def _outcome(t: Any, op: Any) -> Any:
    try:
        return t.apply(op)
    except Exception as e:  # noqa: BLE001 - compared across targets
        return ("raised", type(e).__name__)
