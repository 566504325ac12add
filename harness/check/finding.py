"""What a lockstep run reports: the ``Finding`` (step, operation, both outcomes, message, witness),
the exception that carries it, and observations as witness JSON (the per-step timeout on target
calls, ``StepTimeout`` and ``call_with_timeout``, lives in ``harness.check.timeout``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvspec.harness.check.timeout import StepTimeout, call_with_timeout
from kvspec.harness.core.observation import Observation

__all__ = ["Finding", "FindingError", "StepTimeout", "call_with_timeout", "check_of", "obs_to_json"]


@dataclass
class Finding:
    # divergence | invariant | kv-ledger | kv-mismatch | target-raised | target-hung |
    # target-malformed (an outcome or observation not in its documented form, harness.targets.outcome_schema) |
    # target-memory (MemoryError, or growth past KVSPEC_TARGET_MEMORY_MB, harness.check.memory_guard) |
    # reference-raised | reference-invariant
    kind: str
    step: int | None
    message: str
    op: dict[str, Any] | None = None
    expected: Any = None
    actual: Any = None
    invariant: str | None = None
    blocks: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    witness: dict[str, Any] = field(default_factory=dict)
    traceback: str | None = None
    kv: dict[str, Any] | None = None  # a KV-content mismatch (harness.oracle.target.KVFinding.to_json())
    kv_markdown: str | None = None  # its "KV contents" (or "KV ledger") report section

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        where = f"step {self.step}" if self.step is not None else "setup"
        opname = f" ({self.op['op']})" if self.op else ""
        return f"{self.kind} at {where}{opname}: {self.message}"


class FindingError(AssertionError):
    """Raised at the first problem; Hypothesis shrinks on it."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.summary())
        self.finding = finding


def obs_to_json(obs: Observation, blocks: set[int] | None = None, requests: set[str] | None = None) -> dict[str, Any]:
    """An observation (or the part about ``blocks`` / ``requests``) in JSON form, for witnesses."""
    pos = {b: i for i, b in enumerate(obs.free_queue)}
    bset = set(range(obs.num_blocks)) if blocks is None else {b for b in blocks if 0 <= b < obs.num_blocks}
    return {
        "tables": [{r: list(t) for r, t in g.items() if requests is None or r in requests} for g in obs.tables],
        "num_cached_block": [
            {r: n for r, n in g.items() if requests is None or r in requests} for g in obs.num_cached_block
        ],
        "blocks": {
            str(b): {
                "ref_cnt": obs.ref_cnt[b],
                "hash": None if obs.block_key[b] is None else obs.block_key[b].hex(),  # type: ignore[union-attr]
                "free_pos": pos.get(b),
            }
            for b in sorted(bset)
        },
        "free_queue": list(obs.free_queue),
        "num_hashes": {r: len(h) for r, h in obs.request_block_hashes.items() if requests is None or r in requests},
    }


# The field an observation divergence names, from the start of equality.observation_differences' message.
_OBS_FIELDS = (
    ("group ", "tables"),
    ("num_cached_block", "num_cached_block"),
    ("ref counts", "ref_cnt"),
    ("blocks expected", "ref_cnt"),
    ("block hashes differ", "block_key"),
    ("tokens covered", "block_key_tokens"),
    ("secondary", "secondary_keys"),
    ("free queue", "free_queue"),
    ("cached key", "cached"),
    ("hash map", "cached"),
    ("block hashes of", "request_block_hashes"),
)


def check_of(finding: dict[str, Any]) -> str:
    """Which check fired: the invariant's name, the equality field, or the finding kind."""
    kind, msg = str(finding.get("kind", "?")), str(finding.get("message", ""))
    if finding.get("invariant"):
        return f"{kind}: {finding['invariant']}"
    if kind == "divergence":
        if msg.startswith("outcome differs"):
            return "divergence: outcome"
        detail = msg.split(": ", 1)[-1]
        field = next((f for prefix, f in _OBS_FIELDS if detail.startswith(prefix)), "?")
        return f"divergence: observation/{field}"
    return kind
