"""Each invariant holds on real states and fails on a state that breaks its rule (teeth)."""

from dataclasses import replace

import pytest
from spec_helpers import admit, config

from kvspec.spec import kv_cache_manager as m
from kvspec.spec.config import full_attention, sliding_window
from kvspec.spec.events import BlockStored
from kvspec.spec.invariants import SPEC_INVARIANTS, StepContext, check_invariants, check_step
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.request import append_output_token_ids, make_request, recompute_block_hashes
from kvspec.spec.state import GroupState, KVCacheManagerState
from kvspec.spec.types import BlockHash, BlockId, GroupId


def scenario():
    """Two requests sharing a 2-block prefix, one freed request whose blocks stay cached."""
    cfg = config([full_attention(4)], 12, enable_kv_cache_events=True)
    s = m.init_kv_cache_manager(cfg)
    reqs = {}
    s, reqs["a"], _, _ = admit(s, make_request("a", list(range(9)), cfg))
    s, reqs["b"], _, _ = admit(s, make_request("b", list(range(8)) + [50, 51, 52], cfg))
    s, gone, _, _ = admit(s, make_request("gone", list(range(100, 109)), cfg))
    s = m.free(s, "gone")
    s, events = m.take_events(s)
    return s, reqs, list(events)


def swa_scenario():
    cfg = config([sliding_window(4, 4)], 12)
    s = m.init_kv_cache_manager(cfg)
    s, r, _, _ = admit(s, make_request("w", list(range(13)), cfg))
    return s, {"w": r}


def with_pool(s: KVCacheManagerState, **kw) -> KVCacheManagerState:
    return replace(s, pool=replace(s.pool, **kw))


def with_group0(s: KVCacheManagerState, tables=None, cached=None) -> KVCacheManagerState:
    g = s.groups[0]
    g = GroupState(
        tables if tables is not None else g.req_to_blocks, cached if cached is not None else g.num_cached_block
    )
    return replace(s, groups=(g,) + s.groups[1:])


def set_at(t, i, v):
    return t[:i] + (v,) + t[i + 1 :]


def names(violations):
    return {v.name for v in violations}


def test_all_state_invariants_hold_on_real_states():
    s, reqs, log = scenario()
    assert check_invariants(s, reqs, event_log=log) == []
    s, reqs = swa_scenario()
    assert check_invariants(s, reqs) == []


def test_registry_cites_rules_and_documents_each_predicate():
    assert len(SPEC_INVARIANTS) >= 25
    for inv in SPEC_INVARIANTS.values():
        assert inv.rule.startswith(("§9.", "§12.", "P")) and inv.doc, inv.name


def _break(kind):
    """Return (state, requests, event_log) violating the named invariant."""
    s, reqs, log = scenario()
    a_table = s.groups[0].req_to_blocks["a"]
    free_hashed = next(b for b in s.pool.free_queue if s.pool.block_key[b] is not None)
    if kind == "null_block_is_inert":
        return with_pool(s, free_queue=s.pool.free_queue + (BlockId(0),)), reqs, log
    if kind == "free_queue_well_formed":
        return with_pool(s, free_queue=s.pool.free_queue + s.pool.free_queue[:1]), reqs, log
    if kind == "free_iff_unreferenced":
        return with_pool(s, ref_cnt=set_at(s.pool.ref_cnt, free_hashed, 1)), reqs, log
    if kind == "conservation":
        return with_pool(s, free_queue=s.pool.free_queue[1:]), reqs, log
    if kind == "no_reuse_while_referenced":
        return with_pool(s, free_queue=s.pool.free_queue + (a_table[0],)), reqs, log
    if kind == "ref_count_equals_references":
        b = a_table[2]
        return with_pool(s, ref_cnt=set_at(s.pool.ref_cnt, b, 2)), reqs, log
    if kind == "one_group_per_block":
        cfg2 = replace(s.config, groups=s.config.groups * 2)
        s2 = replace(s, config=cfg2, groups=s.groups + (GroupState({"a": a_table[2:3]}, {}),))
        return s2, reqs, log
    if kind == "no_duplicate_in_table":
        return with_group0(s, {**s.groups[0].req_to_blocks, "a": a_table + a_table[:1]}), reqs, log
    if kind == "sharing_only_through_prefix":
        b_table = s.groups[0].req_to_blocks["b"]
        swapped = (b_table[1], b_table[0]) + b_table[2:]
        return with_group0(s, {**s.groups[0].req_to_blocks, "b": swapped}), reqs, log
    if kind == "hash_map_matches_blocks":
        cached = dict(s.pool.cached)
        key = next(iter(cached))
        cached[key] = cached[key] + (free_hashed,)
        return with_pool(s, cached=cached), reqs, log
    if kind == "hashed_means_full_and_correct":
        # publish a's partial tail block (index 2) under a made-up key
        return with_group0(s, cached={**s.groups[0].num_cached_block, "a": 3}), reqs, log
    if kind == "cache_bounds":
        return with_group0(s, cached={**s.groups[0].num_cached_block, "a": 4}), reqs, log
    if kind == "hash_chain":
        a = reqs["a"]
        return s, {**reqs, "a": replace(a, block_hashes=a.block_hashes[::-1])}, log
    if kind == "table_length_bounded":
        cfg2 = replace(s.config, max_model_len=8)
        return replace(s, config=cfg2), reqs, log
    if kind == "null_pattern":
        return with_group0(s, {**s.groups[0].req_to_blocks, "a": a_table + (BlockId(0),)}), reqs, log
    if kind == "window_nulls_from_front":
        s, reqs = swa_scenario()
        w = s.groups[0].req_to_blocks["w"]
        return with_group0(s, {"w": set_at(w, 2, BlockId(0))}), reqs, []  # (1, 2, null, 4): a hole
    if kind == "dict_membership":
        return s, {k: v for k, v in reqs.items() if k != "b"}, log
    if kind == "free_queue_partition":
        q = s.pool.free_queue
        return with_pool(s, free_queue=q[-1:] + q[:-1]), reqs, log
    if kind == "events_rebuild_hash_map":
        return s, reqs, log + [BlockStored((BlockHash(b"x" * 32),), None, (), 4, GroupId(0))]
    raise AssertionError(kind)


STATE_INVARIANTS = [
    name for name, inv in SPEC_INVARIANTS.items() if inv.kind == "state" and inv.is_in_force("vllm")
]  # SGLang's read the engine's facts: tests/spec/test_invariants_by_engine.py


@pytest.mark.parametrize("name", STATE_INVARIANTS)
def test_each_state_invariant_catches_its_violation(name):
    s, reqs, log = _break(name)
    found = check_invariants(s, reqs, event_log=log)
    assert name in names(found), f"{name} missed its violation; reported {found}"
    assert all(str(v).startswith(v.rule) for v in found)


def test_free_queue_partition_only_applies_to_033_without_evict():
    s, reqs, log = _break("free_queue_partition")
    assert "free_queue_partition" not in names(check_invariants(s, reqs, evict_called=True))
    s20 = replace(s, pool=replace(s.pool, profile=FREE_ORDER_0_20))
    assert "free_queue_partition" not in names(check_invariants(s20, reqs))


# --- step postconditions ------------------------------------------------------------------------------


def step(op, before, after, outcome, request=None, **args):
    return StepContext(before, after, op, args, outcome, request)


def _alloc_step(tamper=None):
    cfg = config([full_attention(4)], 12)
    s0 = m.init_kv_cache_manager(cfg)
    s0, r, _, _ = admit(s0, make_request("a", list(range(9)), cfg))
    r2 = append_output_token_ids(r, [1, 2, 3, 4])
    s1, new = m.allocate_slots(s0, r2, 4)
    if tamper:
        s1, new = tamper(s1, new)
    return step("allocate_slots", s0, s1, new, r2, num_new_tokens=4)


def test_step_postconditions_hold_on_real_operations():
    assert check_step(_alloc_step()) == []
    s, reqs, _ = scenario()
    after = m.free(s, "a")
    assert check_step(step("free", s, after, None, request_id="a")) == []
    assert check_step(step("get_computed_blocks", s, s, m.get_computed_blocks(s, reqs["b"]), reqs["b"])) == []
    after, ok = m.reset_prefix_cache(s)
    assert check_step(step("reset_prefix_cache", s, after, ok)) == []


def _tampered_steps():
    s, reqs, _ = scenario()
    a_table = s.groups[0].req_to_blocks["a"]
    freed = m.free(s, "a")
    hit = m.get_computed_blocks(s, reqs["b"])
    yield "lookup_is_pure_and_bounded", step("get_computed_blocks", s, freed, hit, reqs["b"])
    yield (
        "full_attention_hit_is_maximal",
        step("get_computed_blocks", s, s, replace(hit, blocks=((hit.blocks[0][0],),), num_hit_tokens=4), reqs["b"]),
    )
    yield "failed_allocation_changes_nothing", step("allocate_slots", s, freed, None, reqs["a"], num_new_tokens=1)
    yield "successful_allocation_is_exact", _alloc_step(lambda st, new: (st, ((BlockId(1),),)))
    newcomer = make_request("c", list(range(8)) + [7], s.config)
    c_hit = m.get_computed_blocks(s, newcomer)
    assert c_hit.num_hit_tokens == 8
    # the allocation "succeeded" but never put the hits into c's table
    yield "hits_are_adopted", step("allocate_slots", s, s, ((),), newcomer, num_new_tokens=1, new_computed_blocks=c_hit)
    yield "free_releases_everything", step("free", s, with_group0(freed, {"a": a_table}), None, request_id="a")
    yield (
        "free_order",
        step(
            "free",
            s,
            replace(freed, pool=replace(freed.pool, free_queue=freed.pool.free_queue[::-1])),
            None,
            request_id="a",
        ),
    )
    yield "cache_blocks_publishes_full_blocks", step("cache_blocks", s, freed, None, reqs["a"])
    yield "cached_count_never_decreases", step("take_events", s, with_group0(s, cached={}), ())
    w, wreqs = swa_scenario()
    yield "window_blocks_released", step("remove_skipped_blocks", w, w, None, request_id="w", num_computed_tokens=13)
    yield "evict_only_touches_hashes", step("evict_blocks", s, s, None, block_ids=[a_table[0]])
    yield "reset_only_when_all_free", step("reset_prefix_cache", s, s, True)


STEP_CASES = dict(_tampered_steps())


def test_every_step_invariant_has_a_teeth_case():
    assert set(STEP_CASES) == {n for n, inv in SPEC_INVARIANTS.items() if inv.kind == "step"}


@pytest.mark.parametrize("name", sorted(STEP_CASES))
def test_each_step_invariant_catches_its_violation(name):
    found = check_step(STEP_CASES[name])
    assert name in names(found), f"{name} missed its violation; reported {found}"


# --- the hash recomputation behind hash_chain ---------------------------------------------------------


def test_a_known_recomputation_is_extended_only_from_the_same_tokens():
    cfg = config([full_attention(4)], 12)
    r = make_request("a", list(range(9)), cfg)
    grown = append_output_token_ids(r, [1, 2, 3, 4, 5, 6, 7])
    known = (r, recompute_block_hashes(r, cfg.profile))
    assert recompute_block_hashes(grown, cfg.profile, known) == recompute_block_hashes(grown, cfg.profile)
    known = (grown, recompute_block_hashes(grown, cfg.profile))
    other = append_output_token_ids(r, [8, 8, 8, 8, 8, 8, 8, 8])  # the same prompt, other outputs
    assert recompute_block_hashes(other, cfg.profile, known) == recompute_block_hashes(other, cfg.profile)
    assert recompute_block_hashes(other, cfg.profile)[2] != known[1][2]


def test_hash_chain_checks_a_grown_request_against_its_tokens_not_its_last_version():
    s, reqs, log = scenario()
    assert check_invariants(s, reqs, event_log=log) == []  # remembers a's recomputation
    a = append_output_token_ids(reqs["a"], [5, 6, 7, 8, 9, 10, 11])
    assert "hash_chain" not in names(check_invariants(s, {**reqs, "a": a}, event_log=log))
    forged = replace(a, block_hashes=a.block_hashes[:-1] + (BlockHash(bytes(32)),))  # a wrong new hash
    assert "hash_chain" in names(check_invariants(s, {**reqs, "a": forged}, event_log=log))
    rewritten = replace(a, output_token_ids=(0,) + a.output_token_ids[1:])  # an earlier token changed
    assert "hash_chain" in names(check_invariants(s, {**reqs, "a": rewritten}, event_log=log))


def test_events_replay_follows_a_growing_log_and_notices_a_rewritten_one():
    s, reqs, log = scenario()
    assert check_invariants(s, reqs, event_log=log) == []  # remembers the replay of this log
    bogus = BlockStored((BlockHash(b"y" * 32),), None, (), 4, GroupId(0))
    log.append(bogus)  # the same list, grown by an event no block backs
    assert "events_rebuild_hash_map" in names(check_invariants(s, reqs, event_log=log))
    log.pop()
    assert check_invariants(s, reqs, event_log=log) == []
    log[-1] = bogus  # the last replayed event replaced in place
    assert "events_rebuild_hash_map" in names(check_invariants(s, reqs, event_log=log))
