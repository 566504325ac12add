"""Two vLLM 0.33 behaviours the oracle flags as wrong numbers (candidate findings).

Both follow vLLM 0.33's manager and scheduler faithfully (the spec and, when it is installed, vLLM
itself give the same tables; kvspec's impl refuses both inputs, tests/impl/test_known_bugs_absent.py),
yet the model would attend through the null block:

1. Chunked-local prefix lookup when ``attention_chunk_size % block_size != 0``: the blocks before
   the chunk of ``max_length`` count as hit (nulls), so with C=5, bs=2 and a 6-token prompt the hit
   is 4 tokens and the request computes token 4, whose chunk ``[0, 5)`` lives in those nulls.
2. KV-load failure recovery with a sliding window: the computed count is truncated to the first
   invalid block and recomputed from there, but blocks the window dropped at allocation (out of
   the window of the loaded length) are still needed by the recomputed tokens.
"""

from __future__ import annotations

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.oracle.target import KVCheckTarget, KVMismatch
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, chunked_local, sliding_window

CHUNKED = KVCacheConfig(20, (chunked_local(2, 5),), 40)
CHUNKED_OPS = [
    O.AddRequest("r", (1, 2, 3, 4, 5, 6)),
    O.GetComputedBlocks("r"),  # -> [[0, 0]], 4 hit tokens, nothing cached at all
    O.AllocateSlots("r", 2, num_new_computed_tokens=4, use_computed_blocks=True),
    O.SetNumComputedTokens("r", 6),
]

SWA = KVCacheConfig(20, (sliding_window(4, 7),), 40)
SWA_OPS = [
    O.AddRequest("r", tuple(range(1, 21))),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 4, num_external_computed_tokens=12, use_computed_blocks=True),  # block 0 out of window
    O.SetNumComputedTokens("r", 12),  # synchronous load of tokens 0..11 (into blocks 1, 2)
    O.SetNumComputedTokens("r", 16),  # the step computes 12..15
    O.SetNumComputedTokens("r", 4),  # invalid block 1 reported: truncate to 4 and recompute
    O.AllocateSlots("r", 7),
    O.SetNumComputedTokens("r", 11),
]


def replay(inner, config, ops):
    """The oracle told not to recognise known bugs reports their wrong numbers."""
    t = KVCheckTarget(inner, device="cpu", known_bugs=False)
    t.reset(config)
    for op in ops[:-1]:
        t.apply(op)
    with pytest.raises(KVMismatch) as e:
        t.apply(ops[-1])
    return t, e.value.finding


def test_chunked_local_hit_with_chunk_not_a_block_multiple():
    t, f = replay(SpecTarget(), CHUNKED, CHUNKED_OPS)
    assert t.obs.tables[0]["r"][:2] == (0, 0)
    # Token 4 reads the nulls (token 5 may show NaN too: the torch path multiplies masked-out NaN
    # values by zero probabilities); the culprit slots are exactly tokens 0-3 in the null block.
    assert f.kind == "attention-output" and 4 in f.positions
    assert [b.block_id for b in f.bad_kv] == [0] and f.bad_kv[0].positions == [0, 1, 2, 3]


def test_sliding_window_recompute_after_invalid_block():
    t, f = replay(SpecTarget(), SWA, SWA_OPS)
    assert t.obs.tables[0]["r"][0] == 0
    assert f.kind == "attention-output" and 4 in f.positions
    assert any(b.block_id == 0 for b in f.bad_kv)


@pytest.mark.parametrize(
    "config, ops, bug", [(CHUNKED, CHUNKED_OPS, "K3"), (SWA, SWA_OPS, "K2")], ids=["chunk", "window-recovery"]
)
def test_by_default_the_oracle_recognises_them_as_known_bugs(config, ops, bug):
    """Its own ledger names the known bug (harness.ledger.known_bugs) at the operation that reads the nulls,
    before the numbers are compared: counted, checking stopped for the run, the outcome passed on."""
    t = KVCheckTarget(SpecTarget(), device="cpu")
    t.reset(config)
    for op in ops:
        t.apply(op)
    assert dict(t.stats.known_bugs) == {bug: 1}
    assert t.stopped is not None and bug in t.stopped and f"operation {len(ops) - 1}" in t.stopped
    checked = t.stats.ops
    t.apply(O.AddRequest("s", (9, 9, 9)))  # forwarded, unchecked
    assert t.stats.ops == checked and "s" in t.inner.book.native
    t.reset(config)  # a new run is checked again
    assert t.stopped is None and t.ledger is not None


@pytest.mark.parametrize("config, ops", [(CHUNKED, CHUNKED_OPS), (SWA, SWA_OPS)], ids=["chunk", "window-recovery"])
def test_impl_refuses_them_under_the_oracle(config, ops):
    """impl refuses both inputs (``Unsupported``: the config at reset, the recovery's allocation), so
    the oracle never sees its tables read the nulls."""
    t = KVCheckTarget(ImplTarget(), device="cpu", known_bugs=False)
    with pytest.raises(Unsupported, match="^impl refuses K[23]:"):
        t.reset(config)
        for op in ops:
            t.apply(op)


def test_same_cases_pass_when_the_chunk_is_a_block_multiple():
    """Control: C=6, bs=2 -> the nulls end at the chunk start and the run is correct."""
    t = KVCheckTarget(ImplTarget(), device="cpu")
    t.reset(KVCacheConfig(20, (chunked_local(2, 6),), 40))
    assert t.apply(O.AddRequest("r", (1, 2, 3, 4, 5, 6, 7))) is None
    assert t.apply(O.GetComputedBlocks("r")) == {"block_ids": [[0, 0, 0]], "num_hit_tokens": 6}
    t.apply(O.AllocateSlots("r", 1, num_new_computed_tokens=6, use_computed_blocks=True))
    t.apply(O.SetNumComputedTokens("r", 7))  # token 6 starts chunk [6, 12): needs no null slot
    assert t.stats.model_runs == 1 and t.stats.tokens_checked == 1
