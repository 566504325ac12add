"""Drive two targets through the same generated trace and report the first divergence."""

from __future__ import annotations

from typing import Any

from opgen import scheduler_trace

from spec.config import KVCacheConfig


def run_both(a: Any, b: Any, config: KVCacheConfig, seed: int, steps: int) -> tuple[int, str | None]:
    """Apply one trace to ``a`` and ``b``; return (ops applied, first difference or None)."""
    a.reset(config)
    b.reset(config)
    n = 0
    for op, feed in scheduler_trace(config, seed, steps):
        n += 1
        ra = _outcome(a, op)
        rb = _outcome(b, op)
        if ra != rb:
            return n, f"op #{n} {op}: outcome {ra!r} != {rb!r}"
        if isinstance(ra, tuple):  # both raised the same exception type: the trace ends here
            return n, None
        oa, ob = a.observe(), b.observe()
        if oa != ob:
            fields = [f for f in oa.__dataclass_fields__ if getattr(oa, f) != getattr(ob, f)]
            va, vb = [getattr(oa, f) for f in fields], [getattr(ob, f) for f in fields]
            return n, f"op #{n} {op}: observations differ in {fields}: {va} vs {vb}"
        feed(ra)
    return n, None


def _outcome(t: Any, op: Any) -> Any:
    try:
        return t.apply(op)
    except Exception as e:  # noqa: BLE001 - compared across targets
        return ("raised", type(e).__name__)
