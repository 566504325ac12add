"""Shared pieces of the ledger tests: hand-written op sequences, a seeded driver, the known triggers.

``drive`` runs the one workload (``harness.world.workload.run_seeded``) on a target wrapped in the ledger
(``harness.ledger.checker.LedgerCheckTarget``) and stops at the first ``LedgerMismatch``.  The workload
generates the three vLLM 0.33 trigger paths of docs/findings.md (nothing steers around them), which
``is_known_vllm_trigger`` recognises from a finding's stable signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.ledger.checker import LedgerCheckTarget
from kvspec.harness.ledger.finding import LedgerFinding, LedgerMismatch, match_vllm_033_candidate
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.world.workload import run_seeded
from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window

# --- the three candidate vLLM 0.33 bugs of docs/findings.md, as op sequences -------------------------

# 1. Chunk 5, block size 2: the lookup counts the 2 null blocks before the chunk of position 4 as a
#    hit, and token 4 attends to [0, 5), which lies in those nulls.
CHUNKED = KVCacheConfig(20, (chunked_local(2, 5),), 40)
CHUNKED_OPS = [
    O.AddRequest("r", (1, 2, 3, 4, 5, 6)),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 2, num_new_computed_tokens=4, use_computed_blocks=True),
    O.SetNumComputedTokens("r", 4),
    O.SetNumComputedTokens("r", 6),
]

# 2. Sliding window 7, block size 4: a synchronous load of 12 tokens (block 0 already out of the
#    window), invalid blocks from block 1 on: recomputing token 4 needs positions 0-3 (nulled).
SWA = KVCacheConfig(20, (sliding_window(4, 7),), 40)
SWA_OPS = [
    O.AddRequest("r", tuple(range(1, 21))),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 4, num_external_computed_tokens=12, use_computed_blocks=True),
    O.SetNumComputedTokens("r", 12),
    O.SetNumComputedTokens("r", 16),
    O.SetNumComputedTokens("r", 4),
    O.AllocateSlots("r", 7),
    O.SetNumComputedTokens("r", 11),
]


def full_remote_load_ops(prompt: tuple[int, ...], hit: int) -> list[O.Op]:
    """A whole-prompt async load after a ``hit``-token prefix hit; on arrival the last token is
    recomputed (vLLM 0.33 ``_update_waiting_for_remote_kv``)."""
    n = len(prompt)
    return [
        O.AddRequest("r", prompt),
        O.GetComputedBlocks("r"),
        O.AllocateSlots(
            "r",
            0,
            num_new_computed_tokens=hit,
            use_computed_blocks=True,
            num_external_computed_tokens=n - hit,
            delay_cache_blocks=True,
        ),
        O.SetStatus("r", "WAITING_FOR_REMOTE_KVS"),
        O.SetNumComputedTokens("r", n),
        O.CacheBlocks("r", n),
        O.SetNumComputedTokens("r", n - 1),
        O.SetStatus("r", "RUNNING"),
        O.AllocateSlots("r", 1),
        O.SetNumComputedTokens("r", n),
    ]


# 3. Chunked local, block size 1, chunk 1: a 2-token prompt hits 1 token (a null), an async load
#    brings the other; on arrival the last token is recomputed, into the null block.
FULL_LOAD = KVCacheConfig(8, (chunked_local(1, 1),), 8)
FULL_LOAD_OPS = full_remote_load_ops((1, 2), hit=1)

# The same under full attention: the last token is rewritten, with the same identity, into a block
# the arrival published (legitimate, docs/semantics.md §11.4).
FULL_LOAD_FULL_ATTN = KVCacheConfig(8, (full_attention(2),), 8)
FULL_LOAD_FULL_ATTN_OPS = full_remote_load_ops((1, 2, 3, 4), hit=0)

CANDIDATES = {
    "chunk_not_block_multiple": (CHUNKED, CHUNKED_OPS),
    "window_invalid_block_recovery": (SWA, SWA_OPS),
    "window_full_remote_load": (FULL_LOAD, FULL_LOAD_OPS),
}


def is_known_vllm_trigger(f: LedgerFinding) -> str | None:
    """Which candidate bug of docs/findings.md a finding is, from its stable signature alone."""
    return match_vllm_033_candidate(f.signature)


def replay_ops(inner: Any, config: KVCacheConfig, ops: list[O.Op]) -> tuple[int, LedgerFinding | None]:
    """Apply ``ops`` to ``inner`` wrapped in the ledger; (index of the failing op, finding) or (len, None)."""
    t = LedgerCheckTarget(inner)
    t.reset(config)
    for i, op in enumerate(ops):
        try:
            t.apply(op)
        except LedgerMismatch as e:
            return i, e.finding
    return len(ops), None


@dataclass
class DriveResult:
    ops: int  # operations applied (including the one that failed)
    finding: LedgerFinding | None
    stopped: str | None  # why the run ended early without a ledger finding


def drive(target: Any, config: KVCacheConfig, seed: int, actions: int) -> DriveResult:
    """Reset ``target`` wrapped in the ledger and run ``actions`` seeded workload actions."""
    applied = 0

    def count(op: Any, out: Any) -> None:
        nonlocal applied
        applied += 1

    try:
        run_seeded(LedgerCheckTarget(target), config, seed, actions, on_op=count)
    except LedgerMismatch as e:
        return DriveResult(applied + 1, e.finding, None)
    except Unsupported as e:
        return DriveResult(applied + 1, None, f"unsupported: {e}")
    except Exception as e:  # noqa: BLE001 - a mutant's allocator may break; not a ledger finding
        return DriveResult(applied + 1, None, f"{type(e).__name__}: {e}")
    return DriveResult(applied, None, None)
