"""The vllm target (harness/targets/vllm.py) driven by hand-written op sequences.

Expected values come from vLLM's own tests and the reference notes, not from running the adapter:
the ``test_prefill`` / ``test_prefill_hybrid_model`` vectors of vLLM 0.33's ``test_prefix_caching.py``
and the hashing rules of docs/semantics.md §4.  Hash bytes are checked
against ``spec.hashing`` (an independent re-implementation), never against vLLM's own hasher.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="needs the real vLLM 0.33.0 (ci/setup --vllm)")

from kvspec.harness.core.observation import Observation  # noqa: E402
from kvspec.harness.core.ops import (  # noqa: E402
    AddRequest,
    AllocateSlots,
    AppendOutputTokens,
    EvictBlocks,
    Free,
    GetComputedBlocks,
    MMFeatureSpec,
    RemoveSkippedBlocks,
    ResetPrefixCache,
    SetNumComputedTokens,
    TakeEvents,
)
from kvspec.harness.targets.base import Target, Unsupported  # noqa: E402
from kvspec.harness.targets.vllm import VllmTarget  # noqa: E402
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window  # noqa: E402
from kvspec.spec.releases.line import FREE_ORDER_0_20, RELEASES  # noqa: E402
from kvspec.spec.types import make_block_key  # noqa: E402

pytestmark = pytest.mark.vllm

BS = 16
PROMPT0 = tuple(range(55))  # 3 full blocks + 7 tokens
PROMPT1 = tuple(range(48)) + (900, 901, 902, 903, 904)  # shares 3 full blocks with PROMPT0
PROMPT2 = tuple(range(48)) + (700, 701, 702)


def full_config(**kw: object) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=11, groups=(full_attention(BS),), max_model_len=8192, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def target() -> VllmTarget:
    return VllmTarget()  # imports vLLM once per module (~6 s)


def admit(t: VllmTarget, rid: str, prompt: tuple[int, ...], **features: object) -> tuple[dict, dict | None]:
    """What vLLM's scheduler does for a new request: look up, allocate the rest, advance."""
    t.apply(AddRequest(rid, prompt, **features))  # type: ignore[arg-type]
    hit = t.apply(GetComputedBlocks(rid))
    n = hit["num_hit_tokens"]
    new = t.apply(AllocateSlots(rid, len(prompt) - n, n, use_computed_blocks=True))
    if new is not None:
        t.apply(SetNumComputedTokens(rid, len(prompt)))
    return hit, new


def decode(t: VllmTarget, rid: str, token: int, num_tokens_after: int) -> dict | None:
    t.apply(AppendOutputTokens(rid, (token,)))
    new = t.apply(AllocateSlots(rid, 1))
    t.apply(SetNumComputedTokens(rid, num_tokens_after))
    return new


def test_protocol_and_version(target: VllmTarget) -> None:
    assert isinstance(target, Target)
    assert target.name == "vllm"
    assert target.profile.release in RELEASES
    assert target.version.startswith(f"vllm {target.profile.release} (g")


def test_other_profile_is_unsupported(target: VllmTarget) -> None:
    with pytest.raises(Unsupported):
        target.reset(full_config(profile=FREE_ORDER_0_20))


# --- vLLM 0.33 test_prefill vectors (its test_prefix_caching.py) ------------------------------


def test_prefill_full_attention_vectors(target: VllmTarget) -> None:
    target.reset(full_config())
    obs = target.observe()
    assert obs.free_queue == tuple(range(1, 11)) and obs.ref_cnt == (0,) * 11

    hit, new = admit(target, "r0", PROMPT0)
    assert hit == {"block_ids": [[]], "num_hit_tokens": 0}
    assert new == {"block_ids": [[1, 2, 3, 4]]}

    hit, new = admit(target, "r1", PROMPT1)
    assert hit == {"block_ids": [[1, 2, 3]], "num_hit_tokens": 48}
    assert new == {"block_ids": [[5]]}
    obs = target.observe()
    assert obs.tables == ({"r0": (1, 2, 3, 4), "r1": (1, 2, 3, 5)},)
    assert obs.ref_cnt[1:6] == (2, 2, 2, 1, 1)
    assert obs.num_cached_block == ({"r0": 3, "r1": 3},)

    assert decode(target, "r1", 7, 54) == {"block_ids": [[]]}  # fits in the partial block 5

    target.apply(Free("r0"))
    target.apply(Free("r1"))
    obs = target.observe()
    assert obs.free_queue == (5, 4, 6, 7, 8, 9, 10, 3, 2, 1)
    assert obs.ref_cnt == (0,) * 11
    assert obs.tables == ({},) and obs.num_cached_block == ({},)

    hit, new = admit(target, "r2", PROMPT2)
    assert hit == {"block_ids": [[1, 2, 3]], "num_hit_tokens": 48}
    assert new == {"block_ids": [[5]]}


def test_prefill_sliding_window_vectors(target: VllmTarget) -> None:
    target.reset(KVCacheConfig(num_blocks=11, groups=(sliding_window(BS, 32),), max_model_len=8192))
    assert admit(target, "r0", PROMPT0)[1] == {"block_ids": [[1, 2, 3, 4]]}
    hit, new = admit(target, "r1", PROMPT1)
    assert hit == {"block_ids": [[0, 2, 3]], "num_hit_tokens": 48}
    assert new == {"block_ids": [[5]]}
    assert target.observe().ref_cnt[0] == 0  # the null block's count is not maintained: reported 0
    decode(target, "r1", 7, 54)
    target.apply(Free("r0"))
    target.apply(Free("r1"))
    assert target.observe().free_queue == (5, 4, 6, 7, 8, 9, 10, 1, 3, 2)


def test_prefill_hybrid_vectors(target: VllmTarget) -> None:
    target.reset(KVCacheConfig(num_blocks=21, groups=(full_attention(BS), sliding_window(BS, 32)), max_model_len=8192))
    assert admit(target, "r0", PROMPT0)[1] == {"block_ids": [[1, 2, 3, 4], [5, 6, 7, 8]]}
    hit, new = admit(target, "r1", PROMPT1)
    assert hit == {"block_ids": [[1, 2, 3], [0, 6, 7]], "num_hit_tokens": 48}
    assert new == {"block_ids": [[9], [10]]}
    decode(target, "r1", 7, 54)
    target.apply(Free("r0"))
    target.apply(Free("r1"))
    assert target.observe().free_queue == (10, 9, 8, 4, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 5, 3, 2, 1, 7, 6)
    hit, new = admit(target, "r2", PROMPT2)
    assert hit == {"block_ids": [[1, 2, 3], [0, 6, 7]], "num_hit_tokens": 48}
    assert new == {"block_ids": [[10], [9]]}


def test_out_of_blocks_is_none_and_vllm_errors_propagate(target: VllmTarget) -> None:
    target.reset(full_config())
    target.apply(AddRequest("big", tuple(range(200))))  # needs 13 blocks, 10 usable
    assert target.apply(AllocateSlots("big", 200)) is None
    assert target.observe().free_queue == tuple(range(1, 11))
    with pytest.raises(ValueError):  # vLLM 0.33 allocate_slots rejects an empty allocation
        target.apply(AllocateSlots("big", 0))


# --- observe: the hash map's single-block and dict forms ----------------------------------------


def test_duplicate_key_holds_both_blocks_in_insertion_order(target: VllmTarget) -> None:
    target.reset(full_config())
    prompt = tuple(range(40))  # 2 full blocks
    for rid in ("a", "b"):  # both look up before either is cached: both miss
        target.apply(AddRequest(rid, prompt))
        assert target.apply(GetComputedBlocks(rid))["num_hit_tokens"] == 0
    assert target.apply(AllocateSlots("a", 40, use_computed_blocks=True)) == {"block_ids": [[1, 2, 3]]}
    assert target.apply(AllocateSlots("b", 40, use_computed_blocks=True)) == {"block_ids": [[4, 5, 6]]}
    obs = target.observe()
    hashes = obs.request_block_hashes["a"]
    assert hashes == obs.request_block_hashes["b"] and len(hashes) == 2
    keys = [make_block_key(h, 0) for h in hashes]  # type: ignore[arg-type]
    assert obs.cached == {keys[0]: (1, 4), keys[1]: (2, 5)}
    assert obs.block_key[1] == obs.block_key[4] == keys[0] and obs.block_key[3] is None
    target.apply(EvictBlocks((1,)))
    obs = target.observe()
    assert obs.cached == {keys[0]: (4,), keys[1]: (2, 5)} and obs.block_key[1] is None


# --- events --------------------------------------------------------------------------------------


def _events_scenario(t: VllmTarget) -> tuple[Observation, list, list, list]:
    t.reset(full_config(enable_kv_cache_events=True))
    admit(t, "r0", PROMPT0)
    obs = t.observe()
    stored = t.apply(TakeEvents())
    assert t.apply(TakeEvents()) == []  # drained
    t.apply(Free("r0"))
    admit(t, "big", tuple(range(1000, 1000 + 10 * BS)))  # all 10 blocks: evicts cached blocks 3, 2, 1
    removed = t.apply(TakeEvents())
    t.apply(Free("big"))
    assert t.apply(ResetPrefixCache()) is True
    cleared = t.apply(TakeEvents())
    return obs, stored, removed, cleared


@pytest.mark.parametrize("int_hashes", ["1", "0"], ids=["int-event-hashes", "bytes-event-hashes"])
def test_events_round_trip(target: VllmTarget, monkeypatch: pytest.MonkeyPatch, int_hashes: str) -> None:
    """vLLM publishes event hashes as low-64-bit ints by default; both forms come out as full bytes."""
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", int_hashes)
    obs, stored, removed, cleared = _events_scenario(target)
    hashes = [h.hex() for h in obs.request_block_hashes["r0"]]
    assert len(hashes) == 3 and all(len(h) == 64 for h in hashes)
    assert stored == [
        {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": None,
            "token_ids": list(range(48)),
            "block_size": BS,
            "group_id": 0,
        }
    ]
    # the big request takes the free queue front first; cached blocks 3, 2, 1 go in that order
    removed_hashes = [e["block_hashes"] for e in removed if e["type"] == "BlockRemoved"]
    assert removed_hashes == [[hashes[2]], [hashes[1]], [hashes[0]]]
    assert cleared[-1] == {"type": "AllBlocksCleared"}


def test_events_parent_hash_on_decode(target: VllmTarget) -> None:
    target.reset(full_config(enable_kv_cache_events=True))
    prompt = tuple(range(20))
    admit(target, "r", prompt)
    target.apply(TakeEvents())
    for i, tok in enumerate(range(500, 512)):  # token 32 completes block 1
        decode(target, "r", tok, 21 + i)
    events = target.apply(TakeEvents())
    hashes = [h.hex() for h in target.observe().request_block_hashes["r"]]
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": [hashes[1]],
            "parent_block_hash": hashes[0],
            "token_ids": list(range(16, 20)) + list(range(500, 512)),
            "block_size": BS,
            "group_id": 0,
        }
    ]


# --- what enters the hash (semantics note section 4) ----------------------------------------------


def _hashes(t: VllmTarget, prompt: tuple[int, ...], rid: str, **features: object) -> tuple[bytes, ...]:
    t.apply(AddRequest(rid, prompt, **features))  # type: ignore[arg-type]
    return t.observe().request_block_hashes[rid]


def test_lora_salt_and_mm_change_hashes_as_documented(target: VllmTarget) -> None:
    target.reset(full_config())
    prompt = tuple(range(48))
    plain = _hashes(target, prompt, "plain")
    assert len(plain) == 3

    lora = _hashes(target, prompt, "lora", lora=("adapter", "/a"))
    assert all(a != b for a, b in zip(lora, plain))  # the LoRA key is on every block
    assert _hashes(target, prompt, "lora-same", lora=("adapter", "/a")) == lora
    assert all(a != b for a, b in zip(_hashes(target, prompt, "lora-path", lora=("adapter", "/b")), lora))

    salted = _hashes(target, prompt, "salt", cache_salt="s1")
    assert all(a != b for a, b in zip(salted, plain))  # first block keyed, the chain carries it on
    assert _hashes(target, prompt, "salt-same", cache_salt="s1") == salted
    assert _hashes(target, prompt, "salt-empty", cache_salt="") == plain  # an empty salt adds no key
    assert _hashes(target, prompt, "salt-vs-lora", cache_salt="adapter") != _hashes(
        target, prompt, "lora-vs-salt", lora=("adapter", "adapter")
    )

    # an mm item at [20, 30) overlaps block 1 only; block 0 is unchanged, block 2 changes through the chain
    mm = _hashes(target, prompt, "mm", mm_features=(MMFeatureSpec("img-A", 20, 10),))
    assert mm[0] == plain[0] and mm[1] != plain[1] and mm[2] != plain[2]
    other_id = _hashes(target, prompt, "mm-B", mm_features=(MMFeatureSpec("img-B", 20, 10),))
    assert other_id[0] == plain[0] and other_id[1] != mm[1]
    shifted = _hashes(target, prompt, "mm-shift", mm_features=(MMFeatureSpec("img-A", 21, 9),))
    assert shifted[1] != mm[1]  # the block-relative offset is in the key
    # an item spanning blocks 1 and 2 keys both (block 2 with a negative relative offset)
    span = _hashes(target, prompt, "mm-span", mm_features=(MMFeatureSpec("img-A", 20, 20),))
    assert span[:2] == mm[:2] and span[2] != mm[2]


def test_prefix_hits_respect_features(target: VllmTarget) -> None:
    target.reset(full_config())
    prompt = tuple(range(40))
    admit(target, "lora", prompt, lora=("adapter", "/a"))
    assert admit(target, "plain", prompt)[0]["num_hit_tokens"] == 0
    assert admit(target, "lora2", prompt, lora=("adapter", "/a"))[0]["num_hit_tokens"] == 32
    assert admit(target, "lora3", prompt, lora=("adapter", "/b"))[0]["num_hit_tokens"] == 0


def test_prompt_logprobs_skip_reading_but_still_cache(target: VllmTarget) -> None:
    target.reset(full_config())
    prompt = tuple(range(40))
    admit(target, "r0", prompt)
    hit, new = admit(target, "plp", prompt, skip_reading_prefix_cache=True)
    assert hit == {"block_ids": [[]], "num_hit_tokens": 0}
    assert new == {"block_ids": [[4, 5, 6]]}
    obs = target.observe()
    assert obs.request_block_hashes["plp"] == obs.request_block_hashes["r0"]
    key0 = make_block_key(obs.request_block_hashes["r0"][0], 0)  # type: ignore[arg-type]
    assert obs.cached[key0] == (1, 4)  # the plp request's blocks are cached too (vLLM test_prefill_plp)


# --- hash compatibility with spec.hashing -----------------------------------------------------------

FEATURE_CASES = [
    {},
    {"lora": ("adapter", "/path/a")},
    {"cache_salt": "salt"},
    {"mm_features": (MMFeatureSpec("h0", 3, 5), MMFeatureSpec("h1", 8, 12), MMFeatureSpec("h2", 40, 2))},
    {"lora": ("x", "/y"), "cache_salt": "z", "mm_features": (MMFeatureSpec("h", 0, 17),)},
]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_request_hashes_match_spec_hashing(target: VllmTarget, algo: str) -> None:
    hashing = pytest.importorskip("kvspec.spec.hashing", reason="spec/hashing.py not written yet")
    if not hasattr(hashing, "extend_block_hashes"):
        pytest.skip("kvspec.spec.hashing.extend_block_hashes not written yet")
    seed = os.environ.get("PYTHONHASHSEED")
    target.reset(KVCacheConfig(num_blocks=64, groups=(full_attention(4),), max_model_len=8192, hash_algo=algo))  # type: ignore[arg-type]
    for i, features in enumerate(FEATURE_CASES):
        rid = f"r{i}"
        prompt = tuple(range(100 + i, 145 + i))
        target.apply(AddRequest(rid, prompt, **features))  # type: ignore[arg-type]
        target.apply(AppendOutputTokens(rid, (1, 2, 3)))  # 48 tokens: hashes extend over outputs
        lora = features.get("lora")
        spec_features = hashing.HashFeatures(
            lora=lora,
            mm_features=tuple(
                hashing.MMFeature(m.identifier, m.offset, m.length) for m in features.get("mm_features", ())
            ),
            cache_salt=features.get("cache_salt"),
        )
        expected = hashing.extend_block_hashes((), prompt + (1, 2, 3), spec_features, 4, algo, seed)
        got = target.observe().request_block_hashes[rid]
        assert len(got) == 12
        assert got == expected, f"{algo} {features}"


def test_algo_switch_between_resets_and_targets(target: VllmTarget) -> None:
    """NONE_HASH is a vLLM process global: each target must chain from its own algo's seed."""
    prompt = tuple(range(32))
    target.reset(full_config(hash_algo="sha256"))
    sha = _hashes(target, prompt, "r")
    target.reset(full_config(hash_algo="sha256_cbor"))
    cbor = _hashes(target, prompt, "r")
    assert sha[0] != cbor[0]
    other = VllmTarget()
    other.reset(full_config(hash_algo="sha256"))  # re-seeds the global with sha256
    assert _hashes(target, prompt, "again") == cbor  # ... but target still chains from its cbor seed
    assert _hashes(other, prompt, "r") == sha


# --- vLLM details the observation must carry ----------------------------------------------------


def test_defaultdict_leaves_an_empty_table_that_observe_reports(target: VllmTarget) -> None:
    """vLLM 0.33 ``remove_skipped_blocks`` indexes ``req_to_blocks`` (a defaultdict) even for an
    unknown request, leaving an empty table; the observation shows it as vLLM holds it."""
    target.reset(KVCacheConfig(num_blocks=11, groups=(sliding_window(BS, 32),), max_model_len=8192))
    target.apply(AddRequest("ghost", tuple(range(5))))
    target.apply(RemoveSkippedBlocks("ghost", 100))
    assert target.observe().tables == ({"ghost": ()},)


def test_full_attention_partial_tail_key_is_observed(target: VllmTarget) -> None:
    """vLLM 0.33 ``FullAttentionManager.cache_blocks``: when the group's block size exceeds
    ``hash_block_size``, the prompt's last hash boundary (at most ``num_prompt_tokens - 1``) that
    falls inside a block is also registered, as a second key of that block."""
    target.reset(KVCacheConfig(num_blocks=13, groups=(full_attention(4), sliding_window(2, 4)), max_model_len=64))
    admit(target, "r0", tuple(range(7)))  # hybrid caching rounds down to the LCM: 4 tokens
    decode(target, "r0", 100, 8)  # 8 tokens: FA blocks 0 and 1 full; the prompt boundary 6 is inside block 1
    obs = target.observe()
    fine = obs.request_block_hashes["r0"]  # hashes every 2 tokens
    fa_block1 = obs.tables[0]["r0"][1]
    assert obs.block_key[fa_block1] == make_block_key(fine[3], 0)  # type: ignore[arg-type]
    assert obs.cached[make_block_key(fine[2], 0)] == (fa_block1,)  # type: ignore[arg-type]
    assert make_block_key(fine[0], 0) not in obs.cached  # type: ignore[arg-type]


def test_key_tokens_derived_from_request_hashes_match_the_blocks(target: VllmTarget) -> None:
    """For releases whose blocks do not record the tokens their key covers (0.23), the adapter
    derives them from the request hashes it has seen (``VllmTarget._key_tokens``); on 0.33, which
    records them, the derivation must give the recorded counts for every kind of key."""
    target.reset(KVCacheConfig(num_blocks=13, groups=(full_attention(4), sliding_window(2, 4)), max_model_len=64))
    admit(target, "r0", tuple(range(7)))
    decode(target, "r0", 100, 8)
    obs = target.observe()
    keyed = [b for b, key in enumerate(obs.block_key) if key is not None]
    assert len(keyed) >= 3
    assert [target._key_tokens(obs.block_key[b]) for b in keyed] == [obs.block_key_tokens[b] for b in keyed]
    assert target._key_tokens(b"\x00" * 36) is None and target._key_tokens(None) is None
