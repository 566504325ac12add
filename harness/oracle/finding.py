"""What the KV-content oracle reports: a ``KVFinding`` (raised inside ``KVMismatch``).

A finding names the request, the token positions, the group and layer, the block ids holding wrong
KV (NaN: freed or never written), the largest error and a one-line summary; ``to_json`` /
``to_markdown`` give the report's "KV contents" section (``harness.check.lockstep`` reads ``summary``,
``block_ids``, ``request_id`` and both renderings).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def fmt_positions(ps: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    out: list[str] = []
    ps = sorted(set(ps))
    i = 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[j] + 1:
            j += 1
        out.append(str(ps[i]) if i == j else f"{ps[i]}-{ps[j]}")
        i = j + 1
    return ", ".join(out)


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else "inf")


@dataclass
class BadKV:
    """Slots of one block, in one layer, whose K/V differ from the dense reference."""

    layer: int
    group: int
    block_id: int
    positions: list[int]
    nan: bool  # the slots hold NaN: freed, fresh (never written) or the null block


@dataclass
class KVFinding:
    """One KV-content mismatch, as the report's "KV contents" section shows it."""

    kind: str  # attention-output | prefix-hit | unmapped-slot
    target: str
    request_id: str
    op_index: int  # index of the operation (0-based, counted since reset) at which it showed
    op: dict[str, Any]
    positions: list[int]  # token positions whose output / KV is wrong (or unmapped)
    group: int | None
    layer: int | None
    block_ids: list[int]
    max_abs_err: float
    max_rel_err: float
    summary: str
    bad_kv: list[BadKV] = field(default_factory=list)
    dtype: str = "float32"
    tolerance: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["max_abs_err"] = _json_float(self.max_abs_err)
        out["max_rel_err"] = _json_float(self.max_rel_err)
        return out

    def to_markdown(self) -> str:
        err = (
            "NaN (a poisoned slot was read)"
            if math.isnan(self.max_abs_err) or math.isinf(self.max_abs_err)
            else (f"{self.max_abs_err:.3g} abs, {self.max_rel_err:.3g} rel")
        )
        tol = f"rtol {self.tolerance.get('rtol')} atol {self.tolerance.get('atol')}"
        lines = [
            "## KV contents",
            "",
            self.summary,
            "",
            "| field | value |",
            "|---|---|",
            f"| kind | {self.kind} |",
            f"| target | {self.target} |",
            f"| request | `{self.request_id}` |",
            f"| operation | #{self.op_index} `{self.op.get('op')}` |",
            f"| token positions | {fmt_positions(self.positions)} |",
            f"| group / layer | {self.group} / {self.layer} |",
            f"| block ids | {', '.join(map(str, self.block_ids)) or '-'} |",
            f"| largest error | {err} |",
            f"| dtype, tolerance | {self.dtype}, {tol} |",
        ]
        if self.bad_kv:
            lines += ["", "| layer | group | block | positions | contents |", "|---|---|---|---|---|"]
            for b in self.bad_kv:
                what = "NaN (freed / never written / null block)" if b.nan else "another sequence's KV"
                lines.append(f"| {b.layer} | {b.group} | {b.block_id} | {fmt_positions(b.positions)} | {what} |")
        return "\n".join(lines) + "\n"


class KVMismatch(Exception):
    """The paged cache gave different numbers from the dense reference; ``finding`` says where."""

    def __init__(self, finding: KVFinding) -> None:
        super().__init__(finding.summary)
        self.finding = finding
