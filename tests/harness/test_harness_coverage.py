"""Each family reaches every scheduler action it can (issue 3: "each family reaches all of its
rules"), with a fixed seed so the counts are reproducible.  A workload change that stops reaching
one of them fails here instead of silently narrowing the fuzzing."""

import pytest

from kvspec.harness.check.machine import RunStats, make_machine, run_machine
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.run.profiles import profile_settings
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.world.families import FAMILIES

pytestmark = pytest.mark.statemachine

ACTIONS = {
    "admit",
    "admission_refused",
    "prefill_chunk",
    "decode",
    "prefix_hit",
    "preempt",
    "finish",
    "abort",
    "spec_rejection",
    "async_load",
    "sync_load",
    "load_failed",
    "load_invalid_recompute",
    "abort_while_loading",
    "evict_blocks",
    "reset_ok",
    "reset_refused",
    "feature_lora",
    "feature_cache_salt",
    "feature_mm",
    "feature_prompt_logprobs",
}

# What a family cannot reach, and why.
UNREACHABLE = {
    # vLLM 0.33 recovers from invalid loaded blocks (and evicts them) for one KV-cache group only.
    "hybrid_equal": {"load_invalid_recompute", "evict_blocks"},
    "hybrid_diff": {"load_invalid_recompute", "evict_blocks"},
    # no prefix caching, no hits; chunked-local layouts free blocks as chunks pass, so running
    # requests seldom run out (preemption stays possible but rare: not required here)
    "no_cache": {"prefix_hit", "preempt"},
    "chunked_local": {"preempt"},
    # vLLM 0.33 runs encoder-decoder models uncached and without KV connectors; no drafts here.
    "encoder_decoder": {
        "prefix_hit",
        "spec_rejection",
        "async_load",
        "sync_load",
        "load_failed",
        "load_invalid_recompute",
        "abort_while_loading",
        "evict_blocks",
    },
    # Async scheduling runs without a connector (vLLM defers block frees with one) and drafts.
    "async_sched": {
        "spec_rejection",
        "async_load",
        "sync_load",
        "load_failed",
        "load_invalid_recompute",
        "abort_while_loading",
        "evict_blocks",
    },
    "hash_block_override": {"load_invalid_recompute", "evict_blocks"},  # hybrid layouts only
    "hybrid_two_full": {"load_invalid_recompute", "evict_blocks"},
}

# What a family must reach beyond ACTIONS: the feature it exists for.
EXTRA = {
    "encoder_decoder": {"encoder_input"},
    "async_sched": {"stale_output", "early_cache"},
    "prompt_embeds": {"feature_prompt_embeds"},
}


# The default tier covers one family of each kind of layout and workload; the full tier all of them.
DEFAULT_TIER = ("full", "hybrid_diff")  # the others (about 5 s each) in the full tier


def missing_actions(
    family: str, examples: int, seeds: tuple[int, ...] = (7, 8, 9, 10, 11)
) -> tuple[list[str], dict[str, int]]:
    """Runs of ``examples`` examples (one per seed, in turn) until every action the family can reach
    was seen: those never seen, and the counts."""

    wanted = (ACTIONS - UNREACHABLE.get(family, set())) | EXTRA.get(family, set())
    counts: dict[str, int] = {}
    for seed in seeds:
        stats = RunStats()
        cls = make_machine(family, SpecTarget, "spec", CheckSettings(), stats)
        run_machine(cls, profile_settings("dev", max_examples=examples, database=None), seed=seed, shrink_seconds=5)
        for k, v in stats.events.items():
            if k.startswith(family + ":"):
                counts[k.split(":", 1)[1]] = counts.get(k.split(":", 1)[1], 0) + v
        if all(counts.get(a) for a in wanted):
            return [], counts
    return sorted(a for a in wanted if not counts.get(a)), counts


@pytest.mark.parametrize(
    "family", [f if f in DEFAULT_TIER else pytest.param(f, marks=pytest.mark.full) for f in FAMILIES]
)
def test_family_reaches_its_actions(family, full_tier):
    """Runs (seeds 7, 8, ...) until every reachable action was seen, at most 5 runs: rare actions
    (preemption needs several running requests to outgrow the pool) are reached within a bounded
    budget rather than by one lucky seed.  The default tier's runs are of 80 examples (each family of
    it reaches every action in its first run; about 4 s), the full tier's of 400."""
    examples = 400 if full_tier else 80
    missing, counts = missing_actions(family, examples)
    assert not missing, f"{family} never reached {missing} in 5 x {examples} examples; counts: {counts}"


@pytest.mark.full  # about 20 s; the coverage check it controls is full-tier too (but async_sched)
def test_an_action_the_workload_stops_reaching_fails_the_check(monkeypatch):
    """The deliberate bug: aborts never enabled; the cheap run of the default tier names them."""
    import dataclasses

    from kvspec.harness.check import machine

    never = dataclasses.replace(machine.ACTION_BY_NAME["abort"], enabled=lambda w: False)
    monkeypatch.setitem(machine.ACTION_BY_NAME, "abort", never)
    missing, _ = missing_actions("full", 80, seeds=(7,))
    assert "abort" in missing
