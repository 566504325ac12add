"""Real bugs of older releases, modelled exactly by their profiles, are caught by kvspec's checks.

The profiles reproduce what each release did, bugs included (so the exact comparison agrees with
the real release); the checks that do not depend on profiles (the KV ledger, the spec invariants)
must then report the bug.  Each test plays the scenario on the spec under the buggy release's
profile as the target (the reference runs the same profile), and under the fixed release, which
must run clean.  The traces were played on real vLLM 0.25.1 / 0.26.0 and 0.28.0 / 0.29.0 with the
vllm target (the same outcomes and findings, or none, there); on 0.24.0 (clean) too, while 0.23.0's
coarse-group keys differ from the spec's until its hashing is modelled, so there only the admission
itself (tables, ref counts, free queue: ``test_two_phase_external_allocation``) was compared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from release_helpers import admit, running, tokens

from kvspec.harness.check.finding import FindingError
from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.ledger.known_bugs import split_known
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window
from kvspec.spec.releases.line import profile_for
from kvspec.spec.types import BlockCount, TokenCount


def _play(config: KVCacheConfig, release: str, ops: list[Any]) -> tuple[int, Any] | None:
    """The first finding of ``ops`` under ``release`` (its index and the finding), or None."""
    ls = Lockstep(
        replace(config, profile=profile_for(release)), SpecTarget(), CheckSettings(ledger=True, strict_known=True)
    )
    ls.start()
    for i, op in enumerate(ops):
        try:
            ls.apply(op)
        except FindingError as e:
            return i, e.finding
    return None


def _caught(found: tuple[int, Any] | None, caught: bool) -> tuple[int, Any]:
    """``found`` when the bug should be caught (it must be), else (-1, None) (it must not be)."""
    if not caught:
        assert found is None, found
        return -1, None
    assert found is not None
    return found


def _untrimmed_second_group() -> tuple[KVCacheConfig, list[Any]]:
    """Two full-attention groups and a window; A's window block for tokens 28-31 is evicted, so B's
    hybrid hit drops below the second full group's own hit (K7's trigger)."""
    config = KVCacheConfig(BlockCount(40), (full_attention(4), full_attention(8), sliding_window(4, 4)), TokenCount(64))
    ops = [
        *admit("A", tuple(range(1, 34))),
        *running("A", 33),
        O.EvictBlocks((22,)),  # A's sliding-window block for tokens 28-31
        O.AddRequest("B", tuple(range(1, 34))),
        O.GetComputedBlocks("B"),
    ]
    return config, ops


def _async_rollback_ops() -> list[Any]:
    """Async scheduling with a draft rejection, sliding window (bs 4, W 8).  Step N schedules the
    sampled token and 3 drafts (positions 16-19, in flight); step N+1 is scheduled before N's output
    (computed 20, 4 in flight); N's output rejects the 3 drafts, so the count rolls back to 17 and
    the next step reads positions 10-17."""
    return [
        *admit("r1", tuple(range(1, 17))),
        *running("r1", 16),
        O.AppendOutputTokens("r1", (99,)),
        O.SetSpecTokens("r1", (5, 6, 7)),
        O.AllocateSlots("r1", 4),
        O.SetNumComputedTokens("r1", 20),
        O.SetNumInFlightTokens("r1", 4),
        O.AllocateSlots("r1", 1),  # step N+1: the window is measured here
        O.SetNumComputedTokens("r1", 21),
        O.SetNumInFlightTokens("r1", 5),
        O.SetNumInFlightTokens("r1", 1),  # step N's output: every draft rejected
        O.SetSpecTokens("r1", ()),
        O.AppendOutputTokens("r1", (98,)),
        O.SetNumComputedTokens("r1", 17),
        O.SetNumInFlightTokens("r1", 0),
        O.AllocateSlots("r1", 1),
        O.SetNumComputedTokens("r1", 18),  # the model run of position 17 reads [10, 17]
    ]


def test_window_freed_on_the_computed_total_is_a_ledger_finding() -> None:
    """vLLM up to 0.25.1 (Change ``remove_skipped_blocks_on_processed_tokens``) frees window blocks
    on the computed total, which counts the in-flight drafts: step N+1 frees block 3 (positions
    8-11); after the rollback, position 17 reads position 10 from the null block.  0.26.0 frees on
    the processed count (16) and keeps it."""
    config = KVCacheConfig(BlockCount(20), (sliding_window(4, 8),), TokenCount(64))
    found = _play(config, "0.25.1", _async_rollback_ops())
    assert found is not None
    i, finding = found
    assert i == 19 and finding.kind == "kv-ledger"
    assert "kv_read_in_real_block" in finding.message and "reads position 10 in the null block" in finding.message
    assert _play(config, "0.26.0", _async_rollback_ops()) is None


@pytest.mark.parametrize("release, caught", [("0.28.0", True), ("0.29.0", False)])
def test_untrimmed_second_full_group_is_an_invariant_finding(release: str, caught: bool) -> None:
    """vLLM up to 0.28.0 (Change ``hybrid_lookup_truncates_every_full_attention_group``): with two
    full-attention spec groups a lower hit found later leaves the second one's list long; the spec
    invariant ``lookup_is_pure_and_bounded`` reports the lookup (4 blocks of 8 for a 24-token hit)."""
    config, ops = _untrimmed_second_group()
    i, finding = _caught(_play(config, release, ops), caught)
    if not caught:
        return
    assert i == 7 and finding.kind == "reference-invariant"
    assert "lookup_is_pure_and_bounded" in finding.message and "group 1 returned 4 blocks for a 24-token hit" in (
        finding.message
    )


@pytest.mark.parametrize("release, caught", [("0.23.0", True), ("0.24.0", False)])
def test_hit_popped_by_another_group_is_an_invariant_finding(release: str, caught: bool) -> None:
    """vLLM 0.23.0 (Change ``two_phase_external_allocation``, vLLM issue #33775): group 0 takes its
    external block from the free queue before group 1 touched its hits, pops group 1's hit block 6
    and both tables hold it; the spec invariant ``one_group_per_block`` reports the admission."""
    config = KVCacheConfig(BlockCount(13), (full_attention(4), full_attention(8)), TokenCount(64))
    ops = [
        *admit("A", tokens(16)),
        *running("A", 16),
        *admit("D", tokens(16, 100)),
        *running("D", 16),
        O.Free("A"),
        O.Free("D"),
        O.AddRequest("B", tokens(16) + tokens(9, 200)),
        O.GetComputedBlocks("B"),
        O.AllocateSlots("B", 0, 16, use_computed_blocks=True, num_external_computed_tokens=4, delay_cache_blocks=True),
        *running("B", 20),
        O.CacheBlocks("B", 20),
        O.AllocateSlots("B", 5),
        O.SetNumComputedTokens("B", 25),
    ]
    i, finding = _caught(_play(config, release, ops), caught)
    if not caught:
        return
    assert i == 14 and finding.kind == "reference-invariant"
    assert "one_group_per_block" in finding.message and "block 6 is referenced from groups [0, 1]" in finding.message


def test_a_known_invariant_break_is_counted_in_its_releases_only() -> None:
    """K7 (the untrimmed second full-attention group) is a known bug of 0.23.0-0.28.0: there the
    lookup's invariant break is counted, not raised as a finding, and the example ends (what follows
    is its aftermath); in any other release the same break is a finding (``split_known``)."""
    config, ops = _untrimmed_second_group()
    config = replace(config, profile=profile_for("0.28.0"))
    ls = Lockstep(config, SpecTarget(), CheckSettings(ledger=True, strict_known=False))
    ls.start()
    for op in ops[:-1]:
        ls.apply(op)
    with pytest.raises(Unsupported, match="follows known bug K7"):  # not a finding: the example ends there
        ls.apply(ops[-1])
    assert ls.known_hits == {"K7": 1} and "lookup_is_pure_and_bounded" in ls.muted and ls.ended_by_known == "K7"
    first, steps = ls.known_first["K7"]
    assert first.kind == "reference-invariant" and first.message.startswith("known bug K7") and len(steps) == 8

    @dataclass
    class Broken:
        name: str
        message: str = "m"

    for release, known in (("0.28.0", True), ("0.23.0", True), ("0.29.0", False), ("0.34.0", False), (None, False)):
        unknown, met = split_known([Broken("lookup_is_pure_and_bounded")], release, set())
        assert (len(met), len(unknown)) == ((1, 0) if known else (0, 1)), release
    assert split_known([Broken("one_group_per_block")], "0.23.0", set())[1][0][0].id == "K8"
    assert split_known([Broken("one_group_per_block")], "0.24.0", set())[0]
