"""Drive two targets through the same seeded workload and report the first divergence.

``impl`` refuses the inputs of vLLM's known bugs K1-K3 (``impl.allocator.refusals``), which vLLM and
the spec accept: a run ends where ``a`` refuses one, the two having agreed up to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig

REFUSAL = "impl refuses K"  # how the impl target words such a refusal (harness.targets.impl)


class Diverged(Exception):
    """The two targets answered one operation differently, or reported different states."""


class EndedByRefusal(Exception):
    """``a`` refused an operation as the input of a known vLLM bug."""


@dataclass(frozen=True)
class Raised:
    """What a target raised, compared across targets by the exception's type."""

    kind: str
    message: str = field(compare=False)


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
        ra = _outcome(self.a, op)
        if isinstance(ra, Raised) and ra.message.startswith(REFUSAL):
            raise EndedByRefusal(ra.message)
        rb = _outcome(self.b, op)
        if ra != rb:
            raise Diverged(f"op #{self.applied} {op}: outcome {ra!r} != {rb!r}")
        if isinstance(ra, Raised):
            raise Diverged(f"op #{self.applied} {op}: both raised {ra.kind}")
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
    (operations applied, the first difference or None).  A run ends early, with no difference, where
    ``a`` refuses the input of a known vLLM bug."""
    pair = _Pair(a, b)
    try:
        run_seeded(pair, config, seed, actions)
    except Diverged as e:
        return pair.applied, str(e)
    except EndedByRefusal:
        return pair.applied, None
    return pair.applied, None


def _outcome(t: Any, op: Any) -> Any:
    try:
        return t.apply(op)
    except Exception as e:  # noqa: BLE001 - compared across targets
        return Raised(type(e).__name__, str(e))
