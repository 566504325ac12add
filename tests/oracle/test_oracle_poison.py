"""NaN poisoning has teeth: reads of fresh or released blocks fail only because they are poisoned.

Two hand-written scenarios where the stale contents happen to be the right numbers, so that a
content comparison alone cannot see the bug; with ``poison=False`` the same read passes.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.mutants.impl import make_mutant_target
from kvspec.harness.oracle.target import KVCheckTarget, KVMismatch
from kvspec.spec.config import KVCacheConfig, full_attention

A = tuple(range(10, 20))  # 10 tokens: blocks of 4 -> 2 full blocks + 2 tokens
B = A[:8] + (40, 41, 42)  # shares A's two full blocks
C = tuple(range(20, 36))  # 16 unrelated tokens


def _fresh_allocation_scenario(poison: bool) -> tuple[KVCheckTarget, list[O.Op]]:
    """reuse_while_referenced: A frees, its prefix blocks (still B's) go to C; B reads them
    before C's chunk has written anything."""
    t = KVCheckTarget(make_mutant_target("reuse_while_referenced"), device="cpu", poison=poison)
    t.reset(KVCacheConfig(6, (full_attention(4),), 64))  # blocks 1..5
    ops: list[O.Op] = [
        O.AddRequest("A", A),
        O.GetComputedBlocks("A"),
        O.AllocateSlots("A", 10, use_computed_blocks=True),
        O.SetNumComputedTokens("A", 10),  # blocks 1, 2 (hashed), 3
        O.AddRequest("B", B),
        O.GetComputedBlocks("B"),
        O.AllocateSlots("B", 3, num_new_computed_tokens=8, use_computed_blocks=True),
        O.SetNumComputedTokens("B", 11),  # hit on 1, 2; block 4
        O.Free("A"),  # the bug queues 1 and 2 although B holds them
        O.AddRequest("C", C),
        O.GetComputedBlocks("C"),
        O.AllocateSlots("C", 16, use_computed_blocks=True),
        O.AppendOutputTokens("B", (7,)),
        O.AllocateSlots("B", 1),
        O.SetNumComputedTokens("B", 12),  # B decodes
    ]
    return t, ops


def test_fresh_allocation_poison_catches_the_first_stale_read():
    t, ops = _fresh_allocation_scenario(poison=True)
    for op in ops[:-1]:
        t.apply(op)
    assert set(t.obs.tables[0]["C"]) & {1, 2}, "scenario: C must have been handed B's prefix blocks"
    with pytest.raises(KVMismatch) as e:
        t.apply(ops[-1])
    f = e.value.finding
    assert f.request_id == "B" and f.kind == "attention-output" and f.positions == [11]
    assert {b.block_id for b in f.bad_kv} <= {1, 2} and all(b.nan for b in f.bad_kv)


def test_without_poison_the_same_stale_read_passes():
    t, ops = _fresh_allocation_scenario(poison=False)
    for op in ops:
        t.apply(op)  # no mismatch: blocks 1, 2 still hold A's (= B's) prefix KV
    # Only once C writes its own KV over them does a content comparison see the bug.
    t.apply(O.SetNumComputedTokens("C", 16))
    t.apply(O.AppendOutputTokens("B", (8,)))
    t.apply(O.AllocateSlots("B", 1))
    with pytest.raises(KVMismatch) as e:
        t.apply(O.SetNumComputedTokens("B", 13))
    assert not any(b.nan for b in e.value.finding.bad_kv)  # another sequence's numbers, not NaN


class GhostHitTarget:
    """A scripted manager with one bug: with caching off it reports a prefix hit on the blocks a
    finished request released (ref 0, no hash).  Just enough of the Target protocol."""

    name = "ghost-hit"
    version = "test"

    def reset(self, config: KVCacheConfig) -> None:
        self.n = config.num_blocks
        self.tables: dict[str, tuple[int, ...]] = {}
        self.ref = [0] * self.n

    def apply(self, op: O.Op) -> Any:
        if isinstance(op, O.AllocateSlots):
            table = {"A": (1, 2), "B": (1, 2, 3)}[op.request_id]
            new = [b for b in table if self.ref[b] == 0 and b != 1 and b != 2] if op.request_id == "B" else list(table)
            for b in table:
                self.ref[b] += 1
            self.tables[op.request_id] = table
            return {"block_ids": [new]}
        if isinstance(op, O.GetComputedBlocks):
            return (
                {"block_ids": [[1, 2]], "num_hit_tokens": 8}
                if op.request_id == "B"
                else {"block_ids": [[]], "num_hit_tokens": 0}
            )
        if isinstance(op, O.Free):
            for b in self.tables.pop(op.request_id):
                self.ref[b] -= 1
        return None

    def observe(self) -> Observation:
        return Observation(
            tables=({k: v for k, v in self.tables.items()},),
            num_cached_block=({},),
            ref_cnt=tuple(self.ref),
            free_queue=tuple(b for b in range(1, self.n) if self.ref[b] == 0),
            block_key=(None,) * self.n,
            cached={},
            request_block_hashes={},
        )


def _ghost_hit(poison: bool) -> KVCheckTarget:
    t = KVCheckTarget(GhostHitTarget(), device="cpu", poison=poison)
    t.reset(KVCacheConfig(8, (full_attention(4),), 64, enable_caching=False))
    for op in (
        O.AddRequest("A", A[:8]),
        O.GetComputedBlocks("A"),
        O.AllocateSlots("A", 8, use_computed_blocks=True),
        O.SetNumComputedTokens("A", 8),
        O.Free("A"),  # 1, 2: ref 0 and no hash -> nothing may read them again
        O.AddRequest("B", A[:8] + (50,)),
        O.GetComputedBlocks("B"),
        O.AllocateSlots("B", 1, num_new_computed_tokens=8, use_computed_blocks=True),
    ):
        t.apply(op)
    return t


def test_released_block_poison_catches_a_hit_on_freed_blocks():
    t = _ghost_hit(poison=True)
    with pytest.raises(KVMismatch) as e:
        t.apply(O.SetNumComputedTokens("B", 9))
    f = e.value.finding
    assert f.kind == "prefix-hit" and f.request_id == "B" and f.block_ids == [1, 2]
    assert all(b.nan for b in f.bad_kv) and f.positions == list(range(8))


def test_without_poison_the_hit_on_freed_blocks_passes():
    t = _ghost_hit(poison=False)
    t.apply(O.SetNumComputedTokens("B", 9))  # stale but numerically right: missed
    assert t.stats.hit_tokens_checked == 8
