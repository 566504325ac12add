"""Invariants chosen by what they assume: a vLLM-policy invariant is not checked on another engine,
an engine-neutral one is, and SGLang's policy invariants catch what they state (docs/semantics.md
§9, §12)."""

import dataclasses

import pytest
from test_invariants import names, scenario, set_at, swa_scenario, with_group0, with_pool

from kvspec.harness.check.obs_invariants import ObsContext, check_observation
from kvspec.harness.core import ops as O
from kvspec.harness.run.relation_choice import invariant_set
from kvspec.harness.targets.base import get_target_engine
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.invariants import SPEC_INVARIANTS, check_invariants


def kept_in_tree():
    """A state SGLang reaches legally and vLLM never does: an unreferenced hashed block kept by the
    cache outside the free pool (SGLang's evictable tree page)."""
    s, reqs, _ = scenario()
    kept = next(b for b in s.pool.free_queue if s.pool.block_key[b] is not None)
    return with_pool(s, free_queue=tuple(b for b in s.pool.free_queue if b != kept)), reqs, kept


def test_a_vllm_policy_invariant_is_not_checked_on_sglang():
    s, reqs, _ = kept_in_tree()
    assert "free_iff_unreferenced" in names(check_invariants(s, reqs, engine="vllm"))
    assert names(check_invariants(s, reqs, engine="sglang")) == set()
    assert "free_iff_unreferenced" in names(check_invariants(s, reqs))  # the spec: every rule


def test_an_engine_neutral_invariant_is_checked_on_every_engine():
    s, reqs, _ = scenario()
    lost = next(b for b in s.pool.free_queue if s.pool.block_key[b] is None)
    broken = with_pool(s, free_queue=tuple(b for b in s.pool.free_queue if b != lost))
    for engine in ("vllm", "sglang", "some-other-engine"):
        assert "conservation" in names(check_invariants(broken, reqs, engine=engine)), engine
    table = s.groups[0].req_to_blocks["a"]
    reused = with_pool(s, free_queue=s.pool.free_queue + (table[0],))
    assert "no_reuse_while_referenced" in names(check_invariants(reused, reqs, engine="sglang"))


def test_a_hole_in_a_window_table_is_vllm_policy_and_a_null_in_full_attention_is_not():
    """SGLang's sliding-window table may hold a tree page before pages its window dropped (its run
    reaches it: tests/sglang_target); vLLM only nulls from the front.  A null read by full
    attention is wrong on any engine."""
    s, reqs = swa_scenario()
    holed = with_group0(s, {"w": set_at(s.groups[0].req_to_blocks["w"], 1, 0)})  # (1, null, 3, 4)
    for engine in ("vllm", "sglang"):
        found = names(check_invariants(holed, reqs, engine=engine))
        assert ("window_nulls_from_front" in found) == (engine == "vllm"), (engine, found)
        assert "null_pattern" not in found, engine
    s, reqs, _ = scenario()
    nulled = with_group0(s, {**s.groups[0].req_to_blocks, "a": set_at(s.groups[0].req_to_blocks["a"], 1, 0)})
    for engine in ("vllm", "sglang"):
        assert "null_pattern" in names(check_invariants(nulled, reqs, engine=engine)), engine


def test_policy_sets_are_disjoint_and_every_neutral_rule_holds_on_vllm_states():
    vllm = {inv.name for inv in SPEC_INVARIANTS.in_force("vllm")}
    sglang = {inv.name for inv in SPEC_INVARIANTS.in_force("sglang")}
    neutral = {name for name, inv in SPEC_INVARIANTS.items() if inv.engines is None}
    assert vllm & sglang == neutral
    assert {"conservation", "no_reuse_while_referenced", "no_duplicate_in_table"} <= neutral
    assert "free_queue_partition" in vllm - sglang and "sglang_idle_conservation" in sglang - vllm
    s, reqs, log = scenario()
    assert check_invariants(s, reqs, event_log=log, engine="vllm") == []


def test_the_run_line_names_the_set_in_force():
    assert invariant_set("vllm").endswith("vllm-policy state invariants")
    assert "sglang-policy" in invariant_set("sglang")
    assert "no policy invariants of its own" in invariant_set("my-engine")


# --- SGLang's policy on facts ------------------------------------------------------------------


def idle_facts(**change):
    """Facts of an idle SGLang cache: a 2-node tree, 12 of 32 tokens evictable, the rest free."""
    facts = {
        "sizes": {"full": {"available": 20, "evictable": 12, "protected": 0, "total": 32}},
        "tree": [[1, 0, 8, 0, "full"], [2, 1, 4, 0, "full"]],
        "sanity": None,
        "live": 0,
        "reads": [],
        "rows": {},
        "page_size": 4,
    }
    facts.update(change)
    return facts


def busy_facts():
    """One live request reading both nodes, which it holds locked."""
    return idle_facts(
        sizes={"full": {"available": 20, "evictable": 0, "protected": 12, "total": 32}},
        tree=[[1, 0, 8, 1, "full"], [2, 1, 4, 1, "full"]],
        live=1,
        reads=[["a", 3, 1, "full"], ["a", 5, 1, "full"], ["a", 7, 2, "full"]],
        rows={"a": list(range(12, 20)) + list(range(28, 32))},
    )


BREAKS = {
    "sglang_sanity_check": idle_facts(sanity="node 2: lock_ref -1"),
    "sglang_sizes_match_tree": idle_facts(
        sizes={"full": {"available": 16, "evictable": 16, "protected": 0, "total": 32}}
    ),  # a shared page counted twice
    "sglang_idle_conservation": idle_facts(
        sizes={"full": {"available": 20, "evictable": 8, "protected": 4, "total": 32}},
        tree=[[1, 0, 8, 0, "full"], [2, 1, 4, 1, "full"]],
    ),  # a lock leaked at idle
    "sglang_read_pages_locked": dict(busy_facts(), tree=[[1, 0, 8, 1, "full"], [2, 1, 4, 0, "full"]]),
    "sglang_rows_page_aligned": dict(busy_facts(), rows={"a": [12, 13, 14, 15, 17, 18, 19, 16]}),
}


def sglang_names(facts, engine="sglang"):
    s, reqs, _ = scenario()
    return names(check_invariants(s, reqs, engine=engine, facts=facts))


def test_sglang_facts_of_a_healthy_cache_pass():
    assert sglang_names(idle_facts()) == set()
    busy = busy_facts()
    busy["sizes"]["full"].update(evictable=0, protected=12)
    assert sglang_names(busy) == set()


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_sglang_invariant_catches_its_violation_only_on_sglang(name):
    assert name in sglang_names(BREAKS[name])
    assert name not in sglang_names(BREAKS[name], engine="vllm")


def test_a_window_page_read_is_checked_against_the_window_pools_lock():
    """A node locked in the full pool but not in the sliding-window pool: its window page is not
    protected, and a read of it breaks §12.4; locked in both, it passes."""
    tree = [[1, 0, 8, 1, "full"], [1, 0, 8, 0, "swa"], [2, 1, 4, 1, "full"], [2, 1, 4, 1, "swa"]]
    sizes = {
        "full": {"available": 20, "evictable": 0, "protected": 12, "total": 32},
        "swa": {"available": 20, "evictable": 8, "protected": 4, "total": 32},
    }
    reads = [["a", 3, 1, "full"], ["a", 7, 2, "full"], ["a", 40, 2, "swa"]]
    facts = dict(busy_facts(), tree=tree, sizes=sizes, reads=reads)
    assert sglang_names(facts) == set()
    assert "sglang_read_pages_locked" in sglang_names(dict(facts, reads=reads + [["a", 38, 1, "swa"]]))


def test_a_second_page_of_a_row_split_across_pages_is_caught():
    facts = dict(busy_facts(), rows={"a": [12, 13, 14, 15, 16, 17, 22, 23]})  # page 1: 16-17 then 22-23
    assert "sglang_rows_page_aligned" in sglang_names(facts)


# --- the engine reaches the check through the target ---------------------------------------


class KeepingSpec(SpecTarget):
    """The spec reporting an SGLang-like state: its first hashed free block kept by the cache."""

    engine = "sglang"

    def observe(self):
        obs = super().observe()
        kept = next(b for b in obs.free_queue if obs.block_key[b] is not None)
        return dataclasses.replace(obs, free_queue=tuple(b for b in obs.free_queue if b != kept))


def test_the_targets_engine_selects_the_invariants_checked_on_its_observation():
    config = KVCacheConfig(8, (full_attention(4),), 32)
    t = KeepingSpec()
    t.reset(config)
    t.apply(O.AddRequest("a", (1, 2, 3, 4, 5)))
    t.apply(O.GetComputedBlocks("a"))
    t.apply(O.AllocateSlots("a", 5, use_computed_blocks=True))
    t.apply(O.SetNumComputedTokens("a", 5))
    t.apply(O.Free("a"))
    obs = t.observe()
    assert get_target_engine(t) == "sglang"
    vllm = {v.name for v in check_observation(obs, config, ObsContext(requests=t.requests))}
    sglang = {v.name for v in check_observation(obs, config, ObsContext(requests=t.requests, engine="sglang"))}
    assert "free_iff_unreferenced" in vllm and sglang == set()
    kept = next(b for b in range(1, 8) if b not in obs.free_queue and obs.ref_cnt[b] == 0)
    lost = dataclasses.replace(obs, block_key=set_at(tuple(obs.block_key), kept, None))  # nor kept any more
    found = check_observation(lost, config, ObsContext(requests=t.requests, engine="sglang"))
    assert "conservation" in {v.name for v in found}
