"""Each family reaches every scheduler action it can (issue 3: "each family reaches all of its
rules"), with a fixed seed so the counts are reproducible.  A workload change that stops reaching
one of them fails here instead of silently narrowing the fuzzing."""

import pytest

from harness.check.machine import RunStats, make_machine, run_machine
from harness.check.settings import CheckSettings
from harness.run.profiles import profile_settings
from harness.targets.spec import SpecTarget
from harness.world.families import FAMILIES

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
DEFAULT_TIER = ("full", "hybrid_diff", "encoder_decoder", "async_sched")


@pytest.mark.parametrize(
    "family", [f if f in DEFAULT_TIER else pytest.param(f, marks=pytest.mark.full) for f in FAMILIES]
)
def test_family_reaches_its_actions(family):
    """Runs of 400 examples (seeds 7, 8, ...) until every reachable action was seen, at most 5 runs:
    rare actions (preemption needs several running requests to outgrow the pool) are reached within
    a bounded budget rather than by one lucky seed."""
    wanted = (ACTIONS - UNREACHABLE.get(family, set())) | EXTRA.get(family, set())
    counts: dict[str, int] = {}
    for seed in range(7, 12):
        stats = RunStats()
        cls = make_machine(family, SpecTarget, "spec", CheckSettings(), stats)
        run_machine(cls, profile_settings("dev", max_examples=400, database=None), seed=seed, shrink_seconds=5)
        for k, v in stats.events.items():
            if k.startswith(family + ":"):
                counts[k.split(":", 1)[1]] = counts.get(k.split(":", 1)[1], 0) + v
        if all(counts.get(a) for a in wanted):
            return
    missing = sorted(a for a in wanted if not counts.get(a))
    pytest.fail(f"{family} never reached {missing} in 5 x 400 examples; counts: {counts}")
