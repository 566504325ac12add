"""The finding of a check that fails after an operation, with its witness.

A witness is what a reader needs to see the problem and no more: the requests involved (the
operation's too), the blocks they hold in any observation at hand, those observations (the spec's
and the target's, before and after the operation) cut down to them, and the KV ledger's record or
the glimpses when those found the problem.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvspec.harness.check.finding import Finding, obs_to_json
from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.ledger.finding import LedgerFinding


@dataclass(frozen=True)
class Step:
    """The operation being checked: its index ``i``, the operation, and the outcomes of the
    reference (``expected``) and the target (``actual``) that its findings report."""

    i: int
    op: O.Op
    expected: Any
    actual: Any


def outcome_blocks(a: Any, b: Any) -> set[int]:
    """The block ids in either outcome (their ``block_ids``)."""
    out: set[int] = set()
    for x in (a, b):
        if isinstance(x, dict):
            for g in x.get("block_ids", []):
                out.update(i for i in g if i)
    return out


def held_blocks(observations: Iterable[Observation | None], requests: set[str]) -> set[int]:
    """The blocks ``requests`` hold in any of ``observations``."""
    return {
        b for obs in observations if obs is not None for g in obs.tables for r in requests for b in g.get(r, ()) if b
    }


def state_finding(
    s: Step,
    kind: str,
    message: str,
    observations: dict[str, Observation | None],
    blocks: set[int] | None = None,
    requests: set[str] | None = None,
    invariant: str | None = None,
    ledger: LedgerFinding | None = None,
    extra_witness: dict[str, Any] | None = None,
) -> Finding:
    """The finding of ``kind`` about step ``s``: the ``blocks`` and ``requests`` named, the
    operation's request and every block the requests hold, the named ``observations`` (None: not
    at hand) as witness JSON about them, after the ledger's record and ``extra_witness``."""
    rid = getattr(s.op, "request_id", None)
    requests = set(requests or ()) | ({rid} if rid else set())
    blocks = set(blocks or ()) | held_blocks(observations.values(), requests)
    witness: dict[str, Any] = {} if ledger is None else {"ledger": ledger.to_json()}
    witness.update(extra_witness or {})
    witness.update({name: obs_to_json(obs, blocks, requests) for name, obs in observations.items() if obs is not None})
    return Finding(
        kind,
        s.i,
        message,
        op_to_json(s.op),
        s.expected,
        s.actual,
        invariant,
        sorted(blocks),
        sorted(requests),
        witness,
        kv_markdown=None if ledger is None else ledger.to_markdown(),
    )
