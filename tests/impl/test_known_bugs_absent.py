"""kvspec's ``impl`` does not share vLLM's known bugs (``harness.ledger.known_bugs``, K1-K9).

Each test plays the bug's own witness, the small concrete scenario that shows it: the operation
sequences of tests/ledger/ledger_cases.py and docs/upstream/ (K1-K3, vLLM 0.23.0-0.34.0),
tests/upstream/test_request_key_collisions.py (K4-K6) and tests/spec/releases/test_release_bugs_caught.py
(K7-K9).  It first checks that the witness still shows the bug on the spec under a release that has
it (vLLM 0.33.0 for K1-K3, which the spec models bugs included), then plays it on ``ImplTarget``.
The judges do not depend on impl: the KV ledger (``LedgerCheckTarget``, docs/semantics.md §11), which
knows what every slot holds, and the fact each bug breaks (a block in two groups, a hit list longer
than the hit).

- K1-K3: impl refuses the input (``impl.allocator.refusals``: ``Refused``, which the adapter reports
  as ``Unsupported``) before anything changes, and accepts the inputs next to it that vLLM serves
  correctly, so the refusal is no blanket one.
- K4-K9: bugs of older releases; impl follows 0.33 (processed-token windows, 0.26 and later, for K9)
  and the witness runs clean.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.ledger.checker import LedgerCheckTarget
from kvspec.harness.ledger.finding import LedgerMismatch
from kvspec.harness.ledger.known_bugs import match_known_bug
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.impl.allocator import GroupSpec, KVCacheManager, Refused
from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window
from kvspec.spec.releases.line import profile_for


@dataclass
class Played:
    """How a witness ended on a target wrapped in the KV ledger."""

    ended: str  # "clean", "finding" (the ledger's), "refused" (Unsupported; at -1: the reset)
    at: int = -1  # the operation it ended at
    bug: str | None = None  # the known bug a ledger finding matches
    message: str = ""
    outcomes: list[Any] = field(default_factory=list)


def play(target: Any, config: KVCacheConfig, ops: list[O.Op], release: str = "0.33.0") -> Played:
    """``ops`` on ``target`` under ``release``'s profile, judged by the KV ledger."""
    t = LedgerCheckTarget(target)
    try:
        t.reset(replace(config, profile=profile_for(release)))
    except Unsupported as e:
        return Played("refused", message=str(e))
    outcomes: list[Any] = []
    for i, op in enumerate(ops):
        try:
            outcomes.append(t.apply(op))
        except LedgerMismatch as e:
            bug = match_known_bug(e.finding.signature)
            return Played("finding", i, bug.id if bug else None, e.finding.summary, outcomes)
        except Unsupported as e:
            return Played("refused", i, None, str(e), outcomes)
    return Played("clean", len(ops), outcomes=outcomes)


def witnessed(config: KVCacheConfig, ops: list[O.Op], bug: str, release: str = "0.33.0") -> None:
    """The witness still shows ``bug`` on the spec under ``release`` (a KV-ledger finding)."""
    spec = play(SpecTarget(), config, ops, release)
    assert (spec.ended, spec.bug) == ("finding", bug), spec


def tokens(n: int, start: int = 1) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def admit(rid: str, prompt: tuple[int, ...]) -> list[O.Op]:
    """A request arrives, looks up the prefix cache, is allocated its whole prompt."""
    return [
        O.AddRequest(rid, prompt),
        O.GetComputedBlocks(rid),
        O.AllocateSlots(rid, len(prompt), use_computed_blocks=True),
    ]


def running(rid: str, num_computed_tokens: int) -> list[O.Op]:
    return [O.SetStatus(rid, "RUNNING"), O.SetNumComputedTokens(rid, num_computed_tokens)]


def remote_load(prompt: tuple[int, ...], loaded: int, hit: int = 0) -> list[O.Op]:
    """An async KV load of ``loaded`` tokens after a ``hit``-token prefix hit; on arrival the rest is
    computed, or, when the load covered every token, the last one is recomputed (vLLM 0.33
    ``Scheduler._update_waiting_for_remote_kv``)."""
    n = len(prompt)
    resume = min(loaded, n - 1)
    return [
        O.AddRequest("r", prompt),
        O.GetComputedBlocks("r"),
        O.AllocateSlots(
            "r",
            0,
            num_new_computed_tokens=hit,
            use_computed_blocks=True,
            num_external_computed_tokens=loaded - hit,
            delay_cache_blocks=True,
        ),
        O.SetStatus("r", "WAITING_FOR_REMOTE_KVS"),
        O.SetNumComputedTokens("r", loaded),
        O.CacheBlocks("r", loaded),
        O.SetNumComputedTokens("r", resume),
        O.SetStatus("r", "RUNNING"),
        O.AllocateSlots("r", n - resume),
        O.SetNumComputedTokens("r", n),
    ]


ADMISSION = 2  # the index of the admission's allocate_slots in ``remote_load``


# --- K1: a whole-prompt KV load under a window (docs/upstream/full-remote-load-window.md) -------------

K1_WITNESSES = {
    # chunked local C = 1, B = 1, P = 2 after a 1-token hit: token 1's KV is written into the null block
    "chunked-C1-B1-P2": (KVCacheConfig(8, (chunked_local(1, 1),), 8), tokens(2), 1),
    # the smallest sliding case (W = 2, B = 2, P = 3): (P - W + 1) % B == 0, so position P - W = 1 is lost
    "sliding-W2-B2-P3": (KVCacheConfig(8, (sliding_window(2, 2),), 8), tokens(3), 0),
    "sliding-W2-B2-P5": (KVCacheConfig(8, (sliding_window(2, 2),), 8), tokens(5), 0),
}


@pytest.mark.parametrize("name", sorted(K1_WITNESSES))
def test_k1_whole_prompt_load_that_loses_a_window_block_is_refused(name: str) -> None:
    config, prompt, hit = K1_WITNESSES[name]
    ops = remote_load(prompt, len(prompt), hit)
    witnessed(config, ops, "K1")
    impl = ImplTarget()
    played = play(impl, config, ops)
    assert played.ended == "refused" and played.at == ADMISSION, played
    assert played.message.startswith("impl refuses K1:"), played.message


def test_k1_refusal_leaves_the_manager_unchanged() -> None:
    config, prompt, hit = K1_WITNESSES["sliding-W2-B2-P3"]
    ops = remote_load(prompt, len(prompt), hit)
    impl = ImplTarget()
    impl.reset(config)
    for op in ops[:ADMISSION]:
        impl.apply(op)
    before = impl.observe()
    with pytest.raises(Unsupported):
        impl.apply(ops[ADMISSION])
    assert impl.observe() == before


@pytest.mark.parametrize(
    "prompt_len, loaded",
    [(4, 4), (3, 2)],
    ids=["whole-load-that-keeps-the-window", "load-leaving-the-last-token"],
)
def test_k1_loads_vllm_serves_correctly_are_accepted(prompt_len: int, loaded: int) -> None:
    """W = 2, B = 2: a whole load of 4 tokens releases no block token 3 reads ((4 - 2 + 1) % 2 != 0);
    a load of 2 of 3 tokens (the prefill backoff, fix 1 of the report) leaves token 2 to compute."""
    config = KVCacheConfig(8, (sliding_window(2, 2),), 8)
    played = play(ImplTarget(), config, remote_load(tokens(prompt_len), loaded))
    assert played.ended == "clean", played


# --- K2: invalid-block recovery under a window (docs/upstream/invalid-block-recovery-window.md) -------

# Sliding window 7, block size 4: a synchronous load of 12 tokens (block 0 already out of the window),
# invalid blocks from block 1 on: recomputing token 4 needs positions 0-3 (released).
K2_CONFIG = KVCacheConfig(20, (sliding_window(4, 7),), 40)
K2_OPS = [
    O.AddRequest("r", tokens(20)),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 4, num_external_computed_tokens=12, use_computed_blocks=True),
    O.SetNumComputedTokens("r", 12),
    O.SetNumComputedTokens("r", 16),
    O.SetNumComputedTokens("r", 4),  # invalid block 1 reported: truncated to 4, recomputed from there
    O.AllocateSlots("r", 7),
    O.SetNumComputedTokens("r", 11),
]


def test_k2_resuming_into_a_released_window_is_refused() -> None:
    witnessed(K2_CONFIG, K2_OPS, "K2")
    impl = ImplTarget()
    played = play(impl, K2_CONFIG, K2_OPS)
    assert played.ended == "refused" and played.at == 6, played
    assert played.message.startswith("impl refuses K2:"), played.message
    assert impl.observe().tables[0]["r"][0] == 0  # released at admission, as vLLM 0.33 does


# --- K3: a chunk that is not a block multiple (docs/upstream/chunked-local-chunk-not-block-multiple.md) -

K3_OPS = [
    O.AddRequest("r", tokens(6)),
    O.GetComputedBlocks("r"),
    O.AllocateSlots("r", 2, num_new_computed_tokens=4, use_computed_blocks=True),
    O.SetNumComputedTokens("r", 4),
    O.SetNumComputedTokens("r", 6),
]


def test_k3_chunk_not_a_block_multiple_is_refused_at_construction() -> None:
    """Chunk 5, block 2: vLLM 0.33's lookup counts the two nulls before the chunk of position 4 as a
    4-token hit, and token 4 attends to [0, 5), which lies in them."""
    config = KVCacheConfig(20, (chunked_local(2, 5),), 40)
    witnessed(config, K3_OPS, "K3")
    with pytest.raises(Refused, match="^K3: group 0: attention_chunk_size 5"):
        KVCacheManager([GroupSpec("chunked_local", 2, attention_chunk_size=5)], num_blocks=20, max_model_len=40)
    played = play(ImplTarget(), config, K3_OPS)
    assert played.ended == "refused" and played.at == -1, played
    assert played.message.startswith("impl refuses K3:"), played.message


def test_k3_a_chunk_that_is_a_block_multiple_is_accepted() -> None:
    played = play(
        ImplTarget(), KVCacheConfig(20, (chunked_local(2, 6),), 40), [*admit("r", tokens(6)), *running("r", 6)]
    )
    assert played.ended == "clean", played


# --- K4-K6: block keys that named less than the KV (vLLM 0.23.0-0.30.0) -------------------------------

KEYS_CONFIG = KVCacheConfig(16, (full_attention(4),), 32)
T5 = (1, 2, 3, 1, 2)
PROMPT = (1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2)
IMAGES = (O.MMFeatureSpec("imgA", 8, 1), O.MMFeatureSpec("imgB", 9, 1))


def run_prompt(request: O.AddRequest, hit: int) -> list[O.Op]:
    """``request`` arrives, hits ``hit`` tokens, is allocated the rest and runs its prompt."""
    rid, n = request.request_id, len(request.prompt_token_ids)
    return [
        request,
        O.GetComputedBlocks(rid),
        O.AllocateSlots(rid, n - hit, num_new_computed_tokens=hit, use_computed_blocks=True),
        *running(rid, n),
    ]


def key_witness(bug: str, r2_hit: int) -> list[O.Op]:
    """The witnesses of tests/upstream/test_request_key_collisions.py, r2 allocated after a hit of
    ``r2_hit`` tokens (what its lookup returns where the bug is: its whole first block or blocks)."""
    if bug == "K4":  # one adapter name, two paths
        return run_prompt(O.AddRequest("r1", T5, lora=("a", "/p1")), 0) + run_prompt(
            O.AddRequest("r2", T5, lora=("a", "/p2")), r2_hit
        )
    if bug == "K5":  # block [8, 12) completed by an output token, images A (8) and B (9)
        r1 = [O.AppendOutputTokens("r1", (3,)), O.AllocateSlots("r1", 1), O.SetNumComputedTokens("r1", 12)]
        return [
            *run_prompt(O.AddRequest("r1", PROMPT, mm_features=IMAGES), 0),
            *r1,
            O.AppendOutputTokens("r1", (1,)),
            *run_prompt(O.AddRequest("r2", (*PROMPT, 3, 1), mm_features=IMAGES[1:]), r2_hit),
        ]
    # K6: a LoRA request and a salted one whose salt is the adapter's name
    return run_prompt(O.AddRequest("r1", T5, lora=("sql", "/loras/sql")), 0) + run_prompt(
        O.AddRequest("r2", T5, cache_salt="sql"), r2_hit
    )


# r2's lookup: under the bug it hits r1's block(s) holding other KV; keyed apart, only what truly
# matches (K5: blocks [0, 8), which no image touches).
KEY_HITS = {"K4": (4, 0), "K5": (12, 8), "K6": (4, 0)}


@pytest.mark.parametrize("bug", sorted(KEY_HITS))
def test_k4_to_k6_requests_keyed_apart_share_no_block(bug: str) -> None:
    buggy_hit, hit = KEY_HITS[bug]
    witnessed(KEYS_CONFIG, key_witness(bug, buggy_hit), bug, release="0.30.0")
    ops = key_witness(bug, hit)
    played = play(ImplTarget(), KEYS_CONFIG, ops)
    assert played.ended == "clean", played
    r2_lookup = max(i for i, op in enumerate(ops) if isinstance(op, O.GetComputedBlocks))
    assert played.outcomes[r2_lookup]["num_hit_tokens"] == hit


# --- K7: a hybrid lookup that cuts only the first full-attention group (vLLM 0.23.0-0.28.0) ----------


def test_k7_every_full_attention_group_is_cut_to_the_hit() -> None:
    """Two full-attention groups and a window; A's window block for tokens 28-31 is evicted, so B's
    hit (24 tokens) falls below what the second full group found on its own."""
    config = KVCacheConfig(40, (full_attention(4), full_attention(8), sliding_window(4, 4)), 64)
    ops = [*admit("A", tokens(33)), *running("A", 33), O.EvictBlocks((22,)), O.AddRequest("B", tokens(33))]
    ops.append(O.GetComputedBlocks("B"))
    old = play(SpecTarget(), config, ops, release="0.28.0").outcomes[-1]
    assert old["num_hit_tokens"] == 24 and len(old["block_ids"][1]) == 4  # the bug: 32 tokens of blocks
    played = play(ImplTarget(), config, ops)
    assert played.ended == "clean", played
    hit, lists = played.outcomes[-1]["num_hit_tokens"], played.outcomes[-1]["block_ids"]
    assert hit == 24
    for g, spec in enumerate(config.groups):
        if spec.kind == "full":
            assert len(lists[g]) == -(-hit // spec.block_size), (g, lists)


# --- K8: external blocks that pop another group's untouched hit (vLLM 0.23.0, vLLM #33775) -----------

K8_CONFIG = KVCacheConfig(13, (full_attention(4), full_attention(8)), 64)
K8_OPS = [
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
K8_ADMISSION = 14


def shared_between_groups(target: Any, rid: str) -> set[int]:
    tables = [t.get(rid, ()) for t in target.observe().tables]
    return set(tables[0]) & set(tables[1])


def test_k8_admission_never_puts_a_block_in_two_groups() -> None:
    old = SpecTarget()
    play(old, K8_CONFIG, K8_OPS[: K8_ADMISSION + 1], release="0.23.0")
    assert shared_between_groups(old, "B"), "the witness no longer shows K8 on 0.23.0"
    impl = ImplTarget()
    assert play(impl, K8_CONFIG, K8_OPS[: K8_ADMISSION + 1]).ended == "clean"
    assert not shared_between_groups(impl, "B")
    assert play(ImplTarget(), K8_CONFIG, K8_OPS).ended == "clean"


# --- K9: window blocks freed on the computed total, in-flight tokens included (vLLM up to 0.25.1) -----

# Async scheduling with a draft rejection, sliding window (bs 4, W 8).  Step N schedules the sampled
# token and 3 drafts (positions 16-19, in flight); step N+1 is scheduled before N's output (computed
# 20, 4 in flight); N's output rejects the drafts, so the count rolls back to 17 and the next step
# reads positions 10-17.
K9_CONFIG = KVCacheConfig(20, (sliding_window(4, 8),), 64)
K9_OPS = [
    *admit("r1", tokens(16)),
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
K9_STEP_N1 = 11


def test_k9_window_is_measured_on_the_processed_tokens() -> None:
    witnessed(K9_CONFIG, K9_OPS, "K9", release="0.25.1")
    impl = ImplTarget()
    play(impl, K9_CONFIG, K9_OPS[: K9_STEP_N1 + 1])
    # 16 tokens processed: the next query (position 16) reads from position 9, in block 2
    assert impl.observe().tables[0]["r1"][2] != 0
    played = play(ImplTarget(), K9_CONFIG, K9_OPS)
    assert played.ended == "clean", played  # the rollback to 17 reads [10, 17] in real blocks
