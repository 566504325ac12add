"""The op -> KV-event mapping (``harness.ledger.schedule``) is one, and both consumers read it alike:
the torch oracle and the ledger agree on the paths where the token of a computed position is not
known yet (async scheduling) and on window hits that come back as fresh blocks."""

from __future__ import annotations

from ledger_cases import replay_ops

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.ledger.schedule import get_fresh_blocks
from kvspec.harness.oracle.target import KVCheckTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention

ASYNC = KVCacheConfig(10, (full_attention(2),), 16, max_in_flight_tokens=4)
ASYNC_OPS = [
    O.AddRequest("r", (1, 2)),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 2, use_computed_blocks=True),
    O.SetStatus("r", "RUNNING"),
    O.SetNumComputedTokens("r", 2),
    O.SetNumInFlightTokens("r", 2),
    O.AllocateSlots("r", 1),
    O.SetNumComputedTokens("r", 3),
    O.SetNumInFlightTokens("r", 3),  # position 2: a placeholder
    O.SetNumInFlightTokens("r", 1),
    O.AppendOutputTokens("r", (5,)),  # the first step's token: position 2 is 5
    O.SetNumInFlightTokens("r", 0),
    O.AppendOutputTokens("r", (6,)),
    O.AllocateSlots("r", 1),
    O.SetNumComputedTokens("r", 4),  # position 3 reads position 2
]


def test_async_placeholder_holds_the_appended_token_for_both():
    t = KVCheckTarget(SpecTarget(), device="cpu")
    t.reset(ASYNC)
    for op in ASYNC_OPS:
        t.apply(op)  # the oracle computed position 2 with a filler, then rewrote it with token 5
    assert t.stats.model_runs == 3
    assert replay_ops(SpecTarget(), ASYNC, ASYNC_OPS)[1] is None


def test_a_hit_only_counts_at_its_own_index():
    """A hit the window passed stays untouched and may be handed out fresh elsewhere in the same
    allocation: it is fresh there (its old KV is not this position's)."""
    n = 4
    obs = Observation(({"r": (0, 0, 3)},), ({},), (0, 0, 0, 1), (1, 2), (None,) * n, {}, {})
    assert get_fresh_blocks(None, obs, "r", [[3]], {"block_ids": [[]]}) == {3}
    kept = Observation(({"r": (3, 0, 2)},), ({},), (0, 0, 1, 1), (1,), (None,) * n, {}, {})
    assert get_fresh_blocks(None, kept, "r", [[3]], {"block_ids": [[2]]}) == {2}
