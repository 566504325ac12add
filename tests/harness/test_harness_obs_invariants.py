"""Observation invariants: clean on real spec states, and each check fires on a broken state."""

import dataclasses

import pytest

from kvspec.harness.check.obs_invariants import EventLedger, ObsContext, check_observation
from kvspec.harness.core import ops as O
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention


@pytest.fixture
def running():
    """Two requests sharing a 4-token prefix block (bs 4), both allocated."""
    config = KVCacheConfig(8, (full_attention(4),), 32, enable_kv_cache_events=True)
    t = SpecTarget()
    t.reset(config)
    for rid in ("a", "b"):
        t.apply(O.AddRequest(rid, (1, 2, 3, 4, 5, 6)))
        t.apply(O.GetComputedBlocks(rid))
        assert t.apply(O.AllocateSlots(rid, 6, use_computed_blocks=True)) is not None
        t.apply(O.SetNumComputedTokens(rid, 6))
    return config, t


def names(obs, config, t=None):
    ctx = ObsContext(requests=t.requests) if t is not None else None
    return {v.name for v in check_observation(obs, config, ctx)}


def test_real_state_is_clean(running):
    config, t = running
    assert names(t.observe(), config, t) == set()


def test_each_breakage_is_named(running):
    config, t = running
    obs = t.observe()
    shared = obs.tables[0]["a"][0]
    assert obs.tables[0]["b"][0] == shared and obs.ref_cnt[shared] == 2
    cases = {
        "free_queue_well_formed": dataclasses.replace(obs, free_queue=obs.free_queue + obs.free_queue[:1]),
        "free_iff_unreferenced": dataclasses.replace(obs, free_queue=obs.free_queue + (shared,)),
        "ref_count_equals_references": dataclasses.replace(
            obs, ref_cnt=tuple(1 if b == shared else c for b, c in enumerate(obs.ref_cnt))
        ),
        "null_pattern": dataclasses.replace(obs, tables=({**obs.tables[0], "a": obs.tables[0]["a"] + (0,)},)),
        "null_block_is_inert": dataclasses.replace(obs, free_queue=(0,) + obs.free_queue),
        "hash_map_matches_blocks": dataclasses.replace(obs, cached={}),
        "hash_chain": dataclasses.replace(obs, request_block_hashes={**obs.request_block_hashes, "a": ()}),
    }
    for name, broken in cases.items():
        assert name in names(broken, config, t), name


def test_event_ledger_detects_a_missing_event(running):
    config, t = running
    events = t.apply(O.TakeEvents())
    ledger = EventLedger()
    ledger.feed(events)
    assert ledger.check(t.observe()) == []
    ledger2 = EventLedger()
    ledger2.feed([e for e in events if e["type"] != "BlockStored"])
    assert ledger2.check(t.observe())


def test_event_ledger_names_a_concatenated_key_by_its_last_fine_hash():
    """vLLM 0.23 keys a block of a group two hash blocks wide on both fine hashes concatenated, and its
    int events carry the last one's low 64 bits (spec.hashing.get_published_hash): the replay matches."""
    from kvspec.spec.releases.line import profile_for

    config = KVCacheConfig(16, (full_attention(4), full_attention(8)), 32, enable_kv_cache_events=True)
    t = SpecTarget()
    t.reset(dataclasses.replace(config, profile=profile_for("0.23.0")))
    t.apply(O.AddRequest("a", tuple(range(1, 10))))
    assert t.apply(O.AllocateSlots("a", 9)) is not None
    obs = t.observe()
    assert any(len(k) == 68 for k in obs.cached)  # h0 ++ h1 ++ group 1
    ledger = EventLedger()
    ledger.feed(t.apply(O.TakeEvents()))
    assert ledger.check(obs) == []
