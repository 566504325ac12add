"""The block-hashing changes of spec.releases (v0_29, v0_31), each run on the spec under the profile of
its release and of the release before, against what real vLLM of those releases did.

Every number below was observed by driving the real release's ``KVCacheManager`` with kvspec's vllm
target (the same operations, ``PYTHONHASHSEED`` unset, ``/work/venvs/<release>``): vLLM 0.28.0,
0.29.0, 0.30.0 and 0.31.0.  Hash bytes are computed here with ``python_hash_seed=None`` so that the
test does not depend on the environment's ``PYTHONHASHSEED``; hits do not depend on it at all.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.harness.core import ops as O
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.hashing import RANDOM_NONE_HASH, HashFeatures, MMFeature, extend_block_hashes, get_none_hash
from kvspec.spec.releases.line import CHANGES, profile_for
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import append_output_token_ids, make_request, recompute_block_hashes
from kvspec.spec.types import BlockCount, TokenCount

CHANGE_NAMES = {
    "coarse_group_hash_is_last_fine_hash",
    "none_hash_default_seed",
    "tagged_block_hash_extra_keys",
    "incremental_mm_extra_key_lookup",
}
TOKENS = tuple(range(1, 10))
PROMPT = (1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2)  # 11 tokens: blocks of 4 leave [8, 11) unfinished
IMAGES = (MMFeature("imgA", 8, 1), MMFeature("imgB", 9, 1))


def config(profile: Profile) -> KVCacheConfig:
    return KVCacheConfig(BlockCount(16), (full_attention(4),), TokenCount(32), profile=profile)


def run(version: str, ops: list[O.Op]) -> list[Any]:
    """The outcomes of the lookups and allocations of ``ops`` on the spec under ``version``'s profile."""
    t = SpecTarget()
    t.reset(config(profile_for(version)))
    return [out for op in ops if (out := t.apply(op)) is not None]


def hashes(version: str, tokens: tuple[int, ...], features: HashFeatures, appended: tuple[int, ...] = ()) -> list[str]:
    """A request's block hashes (hex) as its hashing calls make them: the prompt, then ``appended``."""
    prof = profile_for(version)
    made = extend_block_hashes((), tokens, features, 4, "sha256", None, prof)
    return [h.hex() for h in extend_block_hashes(made, tokens + appended, features, 4, "sha256", None, prof)]


def test_every_change_of_this_area_is_in_the_release_line() -> None:
    assert CHANGE_NAMES <= {c.name for c in CHANGES}


# --- 0.24.0 coarse_group_hash_is_last_fine_hash ----------------------------------------------------------


def test_coarse_group_hash_is_last_fine_hash() -> None:
    """Change ``coarse_group_hash_is_last_fine_hash``: observed on vLLM 0.23.0 and 0.24.0.  Groups of
    block sizes 4 and 8 (hash blocks of 4): r1 allocates 9 tokens ([[1, 2, 3], [4, 5]]); group 1's
    block 4 was keyed h0 ++ h1 ++ group 1 (68 bytes) in 0.23.0 and h1 ++ group 1 in 0.24.0 (h_i: r1's
    hashes); the events named h1 for it in both, and r2 (11 tokens, the same prefix) hit 8 tokens,
    [[1, 2], [4]], in both."""
    ops: list[O.Op] = [
        O.AddRequest("r1", TOKENS),
        O.AllocateSlots("r1", 9),
        O.TakeEvents(),
        O.Free("r1"),
        O.AddRequest("r2", (*TOKENS, 1, 2)),
        O.GetComputedBlocks("r2"),
    ]
    group_1 = (1).to_bytes(4, "big")
    for version, key_of_block_4 in (("0.23.0", lambda h: h[0] + h[1]), ("0.24.0", lambda h: h[1])):
        t = SpecTarget()
        t.reset(
            KVCacheConfig(
                BlockCount(16),
                (full_attention(4), full_attention(8)),
                TokenCount(32),
                enable_kv_cache_events=True,
                profile=profile_for(version),
            )
        )
        outs = [t.apply(op) for op in ops]
        obs = t.observe()
        outs += [t.apply(O.EvictBlocks((4,))), t.apply(O.TakeEvents())]
        h = obs.request_block_hashes["r1"]
        assert outs[1] == {"block_ids": [[1, 2, 3], [4, 5]]}
        assert outs[5] == {"block_ids": [[1, 2], [4]], "num_hit_tokens": 8}
        assert outs[-1] == [{"type": "BlockRemoved", "block_hashes": [h[1].hex()], "group_id": 1}]
        assert outs[2][1]["block_hashes"] == [h[1].hex()] and outs[2][1]["group_id"] == 1
        assert obs.block_key[1] == h[0] + bytes(4)
        assert obs.block_key[4] == key_of_block_4(h) + group_1, version


# --- 0.29.0 none_hash_default_seed -------------------------------------------------------------------

PLAIN_029 = [  # tokens 1..8, no extra keys: vLLM 0.29.0 and 0.30.0 and 0.31.0
    "52a7f141c60918f6",
    "bee96bce54f5fcab",
]


def test_none_hash_default_seed() -> None:
    """Change ``none_hash_default_seed``: observed on vLLM 0.28.0 and 0.29.0 (PYTHONHASHSEED unset).
    0.29.0 ``init_none_hash(sha256)`` leaves sha256 of the seed string, 066b1e89..., and the blocks of
    tokens 1..8 hash to 52a7f141... / bee96bce...; 0.28.0 leaves other bytes at every call (two calls
    disagreed), which the spec stands for with ``RANDOM_NONE_HASH``."""
    new, old = profile_for("0.29.0"), profile_for("0.28.0")
    assert get_none_hash("sha256", None, new).hex().startswith("066b1e8987e02713")
    assert get_none_hash("sha256", None, old) == RANDOM_NONE_HASH != get_none_hash("sha256", None, new)
    assert [h[:16] for h in hashes("0.29.0", TOKENS[:8], HashFeatures())] == PLAIN_029
    assert [h[:16] for h in hashes("0.28.0", TOKENS[:8], HashFeatures())] != PLAIN_029
    # PYTHONHASHSEED, when set, was the seed before and after.
    assert get_none_hash("sha256", "42", old) == get_none_hash("sha256", "42", new)


# --- 0.31.0 tagged_block_hash_extra_keys ---------------------------------------------------------------

ALL_KEYS = HashFeatures(lora=("n", "/p"), mm_features=(MMFeature("i", 1, 2),), cache_salt="salty")
ALL_KEYS_030 = [
    "248f4d25022661fcaa3ffc71cce3b93ec1984481b4a8005edd64a429e3556f77",
    "12f56d770db7849149001219bfbfc17ad7a0e216e4aa7ee647154a46c56c7b0b",
]
ALL_KEYS_031 = [
    "5d313aa05c7261808dfb0158d9be5741e807a5c432084cf472d79145241a56a2",
    "5f5b1c894839f7b800c2057bb3e323caf87ef0f2a225f77da337c5284dd8d062",
]


def salt_like_lora_ops() -> list[O.Op]:
    return [
        O.AddRequest("r1", TOKENS[:5], lora=("sql", "/loras/sql")),
        O.AllocateSlots("r1", 5),
        O.AddRequest("r2", TOKENS[:5], cache_salt="sql"),
        O.GetComputedBlocks("r2"),
    ]


def shared_name_ops() -> list[O.Op]:
    return [
        O.AddRequest("r1", TOKENS[:5], lora=("a", "/p1")),
        O.AllocateSlots("r1", 5),
        O.AddRequest("r2", TOKENS[:5], lora=("a", "/p2")),
        O.GetComputedBlocks("r2"),
    ]


def test_tagged_block_hash_extra_keys() -> None:
    """Change ``tagged_block_hash_extra_keys``: observed on vLLM 0.30.0 and 0.31.0.  Tokens 1..8 with
    LoRA ("n", "/p"), image "i" at [1, 3) and salt "salty" hash to ALL_KEYS_030 / ALL_KEYS_031; the
    first block of adapter ("a", "/p1") hashed 19339b50... in 0.30.0 and 39c2d658... in 0.31.0."""
    assert hashes("0.30.0", TOKENS[:8], ALL_KEYS) == ALL_KEYS_030
    assert hashes("0.31.0", TOKENS[:8], ALL_KEYS) == ALL_KEYS_031
    p1 = HashFeatures(lora=("a", "/p1"))
    assert hashes("0.30.0", TOKENS[:5], p1)[0].startswith("19339b50bd3722dc")
    assert hashes("0.31.0", TOKENS[:5], p1)[0].startswith("39c2d658da88d2a5")


@pytest.mark.parametrize("ops", [shared_name_ops(), salt_like_lora_ops()], ids=["lora-shared-name", "salt-like-lora"])
def test_tagged_block_hash_extra_keys_separate_what_bare_keys_shared(ops: list[O.Op]) -> None:
    """Change ``tagged_block_hash_extra_keys``: observed on vLLM 0.30.0 and 0.31.0.  r1 caches 5
    tokens; r2 with the same tokens and adapter ("a", "/p2") after ("a", "/p1"), or with salt "sql"
    after adapter "sql", hit 4 tokens (block 1) in 0.30.0 and nothing in 0.31.0."""
    assert run("0.30.0", ops) == [{"block_ids": [[1, 2]]}, {"block_ids": [[1]], "num_hit_tokens": 4}]
    assert run("0.31.0", ops) == [{"block_ids": [[1, 2]]}, {"block_ids": [[]], "num_hit_tokens": 0}]
    assert run_with(replace(profile_for("0.31.0"), extra_key_form="bare"), ops) == run("0.30.0", ops)


def run_with(profile: Profile, ops: list[O.Op]) -> list[Any]:
    t = SpecTarget()
    t.reset(config(profile))
    return [out for op in ops if (out := t.apply(op)) is not None]


# --- 0.31.0 incremental_mm_extra_key_lookup ------------------------------------------------------------


def resumed_block_ops(
    second: tuple[O.MMFeatureSpec, ...], prompt2: tuple[int, ...], appended2: tuple[int, ...]
) -> list[O.Op]:
    """r1 (images A at 8, B at 9) completes its block [8, 12) with an output token and caches it;
    r2 (``second`` images) is looked up after ``appended2`` output tokens."""
    first = tuple(O.MMFeatureSpec(m.identifier, m.offset, m.length) for m in IMAGES)
    ops: list[O.Op] = [
        O.AddRequest("r1", PROMPT, mm_features=first),
        O.AllocateSlots("r1", 11),
        O.AppendOutputTokens("r1", (3,)),
        O.SetNumComputedTokens("r1", 11),
        O.AllocateSlots("r1", 1),
        O.AddRequest("r2", prompt2, mm_features=second),
    ]
    if appended2:
        ops.append(O.AppendOutputTokens("r2", appended2))
    return [*ops, O.GetComputedBlocks("r2")]


SWAPPED_FIRST = resumed_block_ops((O.MMFeatureSpec("imgC", 8, 1), O.MMFeatureSpec("imgB", 9, 1)), PROMPT, (3, 1))
NEXT_TURN = resumed_block_ops((O.MMFeatureSpec("imgB", 9, 1),), (*PROMPT, 3, 1), ())


@pytest.mark.parametrize("ops", [SWAPPED_FIRST, NEXT_TURN], ids=["same-prompt-other-first-image", "next-turn"])
def test_incremental_mm_extra_key_lookup(ops: list[O.Op]) -> None:
    """Change ``incremental_mm_extra_key_lookup``: observed on vLLM 0.30.0 and 0.31.0.  r1's block
    [8, 12), completed by an output token, was keyed on imgB only in 0.30.0 (d3996e0c...; 0.31.0:
    ae9a8619..., both images), so r2, whose block holds imgB but not imgA there, hit 12 tokens in
    0.30.0 and 8 in 0.31.0."""
    assert run("0.30.0", ops)[-1] == {"block_ids": [[1, 2, 3]], "num_hit_tokens": 12}
    assert run("0.31.0", ops)[-1] == {"block_ids": [[1, 2]], "num_hit_tokens": 8}
    images = HashFeatures(mm_features=IMAGES)
    assert hashes("0.30.0", PROMPT, images, (3,))[2].startswith("d3996e0cc123a194")
    assert hashes("0.31.0", PROMPT, images, (3,))[2].startswith("ae9a8619eec02e55")


@settings(max_examples=200, deadline=None)
@given(
    prompt_len=st.integers(1, 14),
    items=st.lists(st.tuples(st.integers(0, 13), st.sampled_from(["x", "y"])), max_size=3, unique_by=lambda t: t[0]),
    chunks=st.lists(st.integers(1, 5), max_size=4),
    version=st.sampled_from(["0.30.0", "0.31.0"]),
)
def test_recomputing_a_requests_hashes_follows_its_hashing_calls(
    prompt_len: int, items: list[tuple[int, str]], chunks: list[int], version: str
) -> None:
    """``recompute_block_hashes`` (what the hash_chain invariant compares with) equals the request's
    own hashes however its outputs arrived, in the release that keys resumed blocks on the last image
    only and in the one that does not."""
    mm = [MMFeature(i, o, 1) for o, i in sorted(items) if o < prompt_len]
    req = make_request("r", tuple(range(prompt_len)), config(profile_for(version)), mm_features=mm)
    for n in chunks:
        req = append_output_token_ids(req, tuple(range(100, 100 + n)))
    assert recompute_block_hashes(req, profile_for(version)) == req.block_hashes
