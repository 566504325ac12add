"""Each ledger invariant fails on a deliberate bug, from a hand-written op sequence, and holds on the
legitimate paths next to it (docs/semantics.md §11)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ledger_cases import (
    CANDIDATES,
    FULL_LOAD_FULL_ATTN,
    FULL_LOAD_FULL_ATTN_OPS,
    is_known_vllm_trigger,
    replay_ops,
)

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.mutants.impl import make_mutant_target
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, cross_attention, full_attention
from kvspec.spec.kv_ledger import LEDGER_INVARIANTS

FULL4 = KVCacheConfig(10, (full_attention(4),), 16)


def test_every_invariant_has_a_deliberate_bug_here():
    tested = {
        "kv_write_in_real_block",
        "kv_write_keeps_shared",
        "kv_read_in_real_block",
        "kv_read_written",
        "kv_read_own_kv",
        "kv_publish_written",
    }
    assert set(LEDGER_INVARIANTS) == tested


# --- the candidate vLLM 0.33 bugs, on the spec (impl refuses their inputs: tests/impl/test_known_bugs_absent.py)


@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_candidate_bug_is_a_ledger_finding(candidate):
    config, ops = CANDIDATES[candidate]
    i, f = replay_ops(SpecTarget(), config, ops)
    assert f is not None and i == len(ops) - 1, f"{candidate}: no finding"
    assert is_known_vllm_trigger(f) == candidate, f.to_markdown()
    assert f.block == 0  # through the null block
    expected = "kv_write_in_real_block" if candidate == "window_full_remote_load" else "kv_read_in_real_block"
    assert f.invariant == expected, f.to_markdown()


def test_full_remote_load_rewrites_the_same_identity():
    """Full attention: the recomputed last token goes, with the same identity, into the block the
    arrival published (§11.4): legitimate."""
    i, f = replay_ops(SpecTarget(), FULL_LOAD_FULL_ATTN, FULL_LOAD_FULL_ATTN_OPS)
    assert f is None


# --- deliberate allocator bugs ----------------------------------------------------------------------

LORA_OPS = [
    O.AddRequest("a", (1, 2, 3, 4, 5), lora=("sql", "/l/sql")),
    O.GetComputedBlocks("a"),
    O.AllocateSlots("a", 5, use_computed_blocks=True),
    O.SetStatus("a", "RUNNING"),
    O.SetNumComputedTokens("a", 5),
    O.AddRequest("b", (1, 2, 3, 4, 6), lora=("chat", "/l/chat")),
    O.GetComputedBlocks("b"),
    O.AllocateSlots("b", 1, num_new_computed_tokens=4, use_computed_blocks=True),
    O.SetStatus("b", "RUNNING"),
    O.SetNumComputedTokens("b", 4),
    O.SetNumComputedTokens("b", 5),
]


def test_read_own_kv_hit_on_another_adapter():
    """``hash_ignores_lora``: b (LoRA chat) hits a's block (LoRA sql) and reads a's KV."""
    i, f = replay_ops(make_mutant_target("hash_ignores_lora"), FULL4, LORA_OPS)
    assert f is not None and f.invariant == "kv_read_own_kv" and i == len(LORA_OPS) - 1, f
    assert f.request_id == "b" and f.source == "prefix-hit" and "first: a" in f.held
    # Control: under the same adapter the hit is legitimate.
    same = [O.AddRequest("b", (1, 2, 3, 4, 6), lora=("sql", "/l/sql")) if op == LORA_OPS[5] else op for op in LORA_OPS]
    assert replay_ops(ImplTarget(), FULL4, same)[1] is None


def test_publish_written_async_load_published_at_allocation():
    """``hash_before_write`` ignores ``delay_cache_blocks``: the loaded blocks get keys before the
    load arrives."""
    ops = [
        O.AddRequest("a", tuple(range(1, 10))),
        O.GetComputedBlocks("a"),
        O.AllocateSlots("a", 0, use_computed_blocks=True, num_external_computed_tokens=8, delay_cache_blocks=True),
        O.SetStatus("a", "WAITING_FOR_REMOTE_KVS"),
        O.SetNumComputedTokens("a", 8),
        O.CacheBlocks("a", 8),
    ]
    i, f = replay_ops(make_mutant_target("hash_before_write"), FULL4, ops)
    assert f is not None and f.invariant == "kv_publish_written" and i == 2, f
    assert f.held == "unwritten" and f.source == "external-load"
    assert replay_ops(ImplTarget(), FULL4, ops)[1] is None  # published on arrival: fine


REUSE = KVCacheConfig(5, (full_attention(2),), 10)  # 4 usable blocks: c can only get b's
REUSE_OPS = [
    O.AddRequest("a", (1, 2, 3, 4, 5)),
    O.GetComputedBlocks("a"),
    O.AllocateSlots("a", 5, use_computed_blocks=True),
    O.SetStatus("a", "RUNNING"),
    O.SetNumComputedTokens("a", 5),
    O.AddRequest("b", (1, 2, 3, 4, 9)),
    O.GetComputedBlocks("b"),
    O.AllocateSlots("b", 1, num_new_computed_tokens=4, use_computed_blocks=True),
    O.SetStatus("b", "RUNNING"),
    O.SetNumComputedTokens("b", 4),
    O.SetNumComputedTokens("b", 5),
    O.Free("a"),
    O.AppendOutputTokens("b", (7,)),
    O.AddRequest("c", (8, 8, 8, 8, 8, 8)),
    O.AllocateSlots("b", 1),
    O.GetComputedBlocks("c"),
    O.AllocateSlots("c", 6, use_computed_blocks=True),
    O.SetStatus("c", "RUNNING"),
]


def test_read_written_block_reused_while_referenced():
    """``reuse_while_referenced``: freeing a queues the prefix b still holds; c gets it fresh, and
    b's next token reads a block nothing has written since."""
    ops = REUSE_OPS + [O.SetNumComputedTokens("b", 6), O.SetNumComputedTokens("c", 6)]
    i, f = replay_ops(make_mutant_target("reuse_while_referenced"), REUSE, ops)
    assert f is not None and f.invariant == "kv_read_written" and f.request_id == "b", f
    assert i == len(ops) - 2
    # Control: the correct allocator cannot serve c at all.
    t = ImplTarget()
    t.reset(REUSE)
    outs = [t.apply(op) for op in REUSE_OPS]
    assert outs[-2] is None


def test_read_own_kv_when_the_reuser_ran_first():
    """Same bug, c computed first in the step: b reads c's KV (every write lands before any read)."""
    ops = REUSE_OPS + [O.SetNumComputedTokens("c", 6), O.SetNumComputedTokens("b", 6)]
    i, f = replay_ops(make_mutant_target("reuse_while_referenced"), REUSE, ops)
    assert f is not None and f.invariant == "kv_read_own_kv" and f.request_id == "b" and "first: c" in f.held, f


DRAFT_OPS = [
    O.AddRequest("a", (1, 2, 3, 4, 5, 6)),
    O.GetComputedBlocks("a"),
    O.AllocateSlots("a", 6, use_computed_blocks=True),
    O.SetStatus("a", "RUNNING"),
    O.SetNumComputedTokens("a", 6),
    O.AppendOutputTokens("a", (7,)),
    O.SetSpecTokens("a", (8,)),
    O.AllocateSlots("a", 2),
    O.SetSpecTokens("a", ()),
    O.SetNumComputedTokens("a", 8),  # token 7 and draft 8
    O.SetNumComputedTokens("a", 7),
    O.AppendOutputTokens("a", (9,)),  # draft rejected, 9 sampled
    O.AllocateSlots("a", 1),
    O.SetNumComputedTokens("a", 8),  # position 7 recomputed with 9
]


def test_write_keeps_shared_draft_block_published():
    """Spec mutant ``cache_drafts`` publishes the block holding a draft; once the draft is rejected the
    real token is written over a published slot."""
    i, f = replay_ops(resolve("mutant:cache_drafts").factory(), FULL4, DRAFT_OPS)
    assert f is not None and f.invariant == "kv_write_keeps_shared" and i == len(DRAFT_OPS) - 1, f
    assert f.position == 7 and f.shared
    assert replay_ops(SpecTarget(), FULL4, DRAFT_OPS)[1] is None  # unpublished draft slots: rewritten freely


# --- step semantics, on a scripted manager ------------------------------------------------------------


class ScriptedTarget:
    """A 'manager' that hands both requests block 1 with ``ref_cnt`` 1 (a broken ref count)."""

    name = "scripted"
    version = "scripted"

    def __init__(self) -> None:
        self.tables: dict[str, tuple[int, ...]] = {}

    def reset(self, config: KVCacheConfig) -> None:
        self.tables = {}

    def apply(self, op: O.Op) -> Any:
        if isinstance(op, O.AllocateSlots):
            new = () if op.request_id in self.tables else (1,)
            self.tables[op.request_id] = (1,)
            return {"block_ids": [list(new)]}
        return None

    def observe(self) -> Observation:
        n = 4
        ref = tuple(1 if b == 1 and self.tables else 0 for b in range(n))
        return Observation((dict(self.tables),), ({},), ref, tuple(b for b in range(2, n)), (None,) * n, {}, {})


def scripted_ops(boundary: bool) -> list[O.Op]:
    ops: list[O.Op] = [
        O.AddRequest("x", (1, 2)),
        O.AddRequest("y", (5, 6)),
        O.AllocateSlots("x", 2),
        O.AllocateSlots("y", 2),
        O.SetNumComputedTokens("x", 2),
    ]
    if boundary:
        ops.append(O.AppendOutputTokens("x", (3,)))  # the step ends
    return ops + [O.SetNumComputedTokens("y", 2)]


def test_a_later_write_in_the_same_step_is_a_wrong_read():
    i, f = replay_ops(ScriptedTarget(), FULL4, scripted_ops(boundary=False))
    assert f is not None and f.invariant == "kv_read_own_kv" and f.request_id == "x" and "first: y" in f.held, f
    assert i == 5  # reported at y's write, against x's read


def test_a_write_in_a_later_step_is_not_a_read_of_this_step():
    i, f = replay_ops(ScriptedTarget(), FULL4, scripted_ops(boundary=True))
    assert f is None


# --- cross attention ---------------------------------------------------------------------------------

ENC_DEC = KVCacheConfig(20, (full_attention(2), cross_attention(2)), 20, enable_caching=False)
ENC_OPS = [
    O.AddRequest("e", (1, 2, 3), mm_features=(O.MMFeatureSpec("audio-4", 0, 4),)),
    O.GetComputedBlocks("e"),
    O.AllocateSlots("e", 3, use_computed_blocks=True, num_encoder_tokens=4),
    O.SetStatus("e", "RUNNING"),
    O.SetNumComputedTokens("e", 3),  # writes the encoder KV, reads it
    O.AppendOutputTokens("e", (4,)),
    O.AllocateSlots("e", 1),
    O.SetNumComputedTokens("e", 4),
]


class LosesCrossBlocks(SpecTarget):
    """Reports an empty cross-attention table once the first step has run (a manager that drops it)."""

    def observe(self) -> Observation:
        obs = super().observe()
        e = self.book.requests.get("e")
        if e is None or e.num_computed_tokens < 3:
            return obs
        return dataclasses.replace(obs, tables=(obs.tables[0], {}))


def test_cross_attention_reads_every_encoder_position():
    assert replay_ops(SpecTarget(), ENC_DEC, ENC_OPS)[1] is None
    i, f = replay_ops(LosesCrossBlocks(), ENC_DEC, ENC_OPS)
    assert f is not None and i == len(ENC_OPS) - 1, f
    assert f.invariant == "kv_read_in_real_block" and f.group_kind == "cross" and f.source == "encoder", f.to_markdown()
    assert f.block is None and f.position == 0
