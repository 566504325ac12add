"""What the KV ledger reports: a ``LedgerFinding`` (a broken ``spec.kv_ledger`` invariant and its witness).

A finding's ``signature`` is stable and matchable (no request or block ids): the invariant, the
group's attention kind, block size and window / chunk, the request's prompt length, where the
position read came from (a prefix hit, a connector load, the model) and why the token was computed
again (``full-remote-load``, ``load-recovery``).  ``description`` renders it in one line, so a
registry of known bugs can match either.  ``to_json`` / ``to_markdown`` give the report's section.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvspec.spec.config import AttentionSpec

VERBS = {"write": "writes", "read": "reads", "publish": "publishes"}
DIFFERS = {  # spec.kv_ledger.identity.Difference, in words
    "lora-path": "the LoRA adapter's path (same name)",
    "lora": "the LoRA adapter",
    "cache-salt": "the cache salt (tenant)",
    "mm": "a multimodal item",
    "prompt-embeds": "the prompt embeddings",
    "tokens": "the tokens",
    "position": "the position",
}


@dataclass
class LedgerFinding:
    """One broken ledger invariant, with the access that broke it."""

    invariant: str
    rule: str
    access: str  # write | read | publish
    request_id: str
    group: int
    group_kind: str
    block_size: int
    window: int | None  # sliding window W
    chunk: int | None  # chunked-local chunk C
    prompt_len: int
    num_tokens: int
    token: int  # the token whose computation (or the position whose publication) made the access
    position: int  # the KV position accessed
    block: int | None  # None: past the table
    slot: int
    expected: str  # what the access needs (or brings, for a write)
    held: str  # what the slot holds
    source: str  # where the position's KV came from: prefix-hit | external-load | computed | encoder
    recompute: str | None  # full-remote-load | load-recovery: why the token was computed again
    shared: bool  # the block was referenced twice or published (writes)
    op_index: int = -1
    differs: str | None = None  # what separates held from expected (spec.kv_ledger.identity.Difference)
    release: str | None = None  # the vLLM release the run modelled (None: a what-if profile)

    @property
    def signature(self) -> dict[str, Any]:
        """The stable, matchable fields (no request ids, block ids or positions); ``differs`` says
        what separates the KV held from the KV needed, ``release`` which release was modelled."""
        return {
            "invariant": self.invariant,
            "group_kind": self.group_kind,
            "block_size": self.block_size,
            "window": self.window,
            "chunk": self.chunk,
            "chunk_multiple_of_block": None if self.chunk is None else self.chunk % self.block_size == 0,
            "prompt_len": self.prompt_len,
            "source": self.source,
            "recompute": self.recompute,
            "differs": self.differs,
            "release": self.release,
        }

    @property
    def description(self) -> str:
        """The signature in one line, e.g. ``kv_read_in_real_block: chunked_local(C=5, bs=2), prompt 6
        tokens, position from a prefix hit``."""
        size = (
            f"W={self.window}, " if self.window is not None else f"C={self.chunk}, " if self.chunk is not None else ""
        )
        out = f"{self.invariant}: {self.group_kind}({size}bs={self.block_size}), prompt {self.prompt_len} tokens"
        out += f", position from {self.source.replace('-', ' ')}"
        if self.recompute is not None:
            out += f", recomputed after {self.recompute.replace('-', ' ')}"
        if self.differs not in (None, "unwritten"):
            out += f", held KV differs in {DIFFERS.get(self.differs, self.differs)}"
        return out

    @property
    def summary(self) -> str:
        where = (
            "past the table"
            if self.block is None
            else "in the null block"
            if self.block == 0
            else f"in block {self.block} slot {self.slot}"
        )
        verb = VERBS[self.access]
        what = (
            f"token {self.token} {verb} position {self.position}"
            if self.access != "publish"
            else f"publishes position {self.position}"
        )
        return (
            f"{self.description}. Request {self.request_id}: {what} {where} (group {self.group}); "
            f"needs {self.expected}, holds {self.held}"
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["signature"] = self.signature
        out["description"] = self.description
        return out

    def to_markdown(self) -> str:
        rows = [
            ("invariant", f"`{self.invariant}` ({self.rule}, docs/semantics.md)"),
            ("access", self.access),
            ("request", f"`{self.request_id}` (prompt {self.prompt_len} tokens, {self.num_tokens} now)"),
            (
                "group",
                f"{self.group}: {self.group_kind}, block size {self.block_size}"
                + (f", window {self.window}" if self.window is not None else "")
                + (f", chunk {self.chunk}" if self.chunk is not None else ""),
            ),
            ("token / position", f"{self.token} / {self.position}"),
            ("block / slot", f"{'-' if self.block is None else self.block} / {self.slot}"),
            ("expected", self.expected),
            ("held", self.held),
            ("held KV differs in", DIFFERS.get(self.differs or "", self.differs or "-")),
            ("release", self.release or "what-if profile"),
            (
                "position came from",
                self.source + (f"; token recomputed after {self.recompute}" if self.recompute else ""),
            ),
        ]
        lines = ["## KV ledger", "", self.summary, "", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in rows]
        return "\n".join(lines) + "\n"


class LedgerMismatch(Exception):
    """A ledger invariant broke; ``finding`` says where (raised by ``harness.ledger.checker.LedgerCheckTarget``)."""

    def __init__(self, finding: LedgerFinding) -> None:
        super().__init__(finding.summary)
        self.finding = finding


def match_vllm_033_candidate(signature: dict[str, Any]) -> str | None:
    """Which candidate vLLM 0.33 bug of docs/findings.md a finding's ``signature`` shows, or None:
    a window group computing through the null block (or past its table) while recomputing after a
    whole-prompt async load (``window_full_remote_load``) or after a failed load / invalid blocks
    (``window_invalid_block_recovery``), or a chunked-local prefix hit whose chunk is not a multiple
    of the block size (``chunk_not_block_multiple``).  For a registry of known bugs to match."""
    s = signature
    if s["invariant"] not in ("kv_read_in_real_block", "kv_write_in_real_block"):
        return None
    if s["group_kind"] not in ("sliding_window", "chunked_local"):
        return None
    if s["recompute"] == "full-remote-load":
        return "window_full_remote_load"
    if s["recompute"] == "load-recovery":
        return "window_invalid_block_recovery"
    if s["group_kind"] == "chunked_local" and s["chunk_multiple_of_block"] is False and s["source"] == "prefix-hit":
        return "chunk_not_block_multiple"
    return None


def group_sizes(spec: AttentionSpec) -> tuple[int | None, int | None]:
    """(window, chunk) of a group, None where the kind has none."""
    return (
        int(spec.sliding_window) if spec.sliding_window is not None else None,
        int(spec.attention_chunk_size) if spec.attention_chunk_size is not None else None,
    )
