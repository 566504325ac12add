"""Tests for spec/hashing.py: byte-identity with vLLM 0.33.0's block hashing."""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.spec.hashing import (
    NO_FEATURES,
    HashFeatures,
    MMFeature,
    canonical_cbor,
    extend_block_hashes,
    generate_block_extra_keys,
    get_hash_fn,
    get_none_hash,
    hash_block_tokens,
)
from kvspec.spec.types import BlockHash

# ---------------------------------------------------------------------------------------------
# 1. Fixed vectors.  Every hex digest below was produced by the installed vLLM 0.33.0 (not by
# spec/hashing.py), with PYTHONHASHSEED unset unless stated: NONE_HASH by
# vllm.v1.core.kv_cache_utils.init_none_hash(vllm.utils.hashing.sha256 / sha256_cbor), block hashes
# as Request(..., block_hasher=get_request_block_hasher(4, hash_fn)).block_hashes, extra keys by
# generate_block_hash_extra_keys(request, start, end, 0).

VLLM_NONE_HASH = {
    "sha256": "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
    "sha256_cbor": "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
}
# init_none_hash(sha256) with PYTHONHASHSEED=42.
VLLM_NONE_HASH_SHA256_SEED_42 = "c0bc02c9fc92a4944335649961b9e55cc41b194bece4801e8c6ef0f0f3f5884a"

# prompt_token_ids=list(range(14)), hbs=4, sha256: three full blocks, two tokens left over.
VLLM_CHAIN = [
    "9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd",
    "1c9b6c0620e875631f1c5395ed56f2243aa113f88fc842f04fbb0654074b8d43",
    "cc25a655502dc3a6a6161c497c0afb907f8b3bb808d5db5827d3d9de7bd66f25",
]
# list(range(12)), lora_request=LoRARequest("adapter-a", 1, "/loras/a"), sha256.
VLLM_LORA = [
    "125456463d618e6d4d6091a08410185cba921ca0208d4be43a5e93c383a273c7",
    "e9d2b3e38306bf5eaa3079b131a7b6a247a0a4a45366c819c5f87ef613096695",
    "f36968103a7e7965833077c7ea23474d68645d9aa04ad31dba45719b7250c524",
]
# list(range(12)), one image identifier "img-hash-1" at PlaceholderRange(offset=3, length=5), sha256.
VLLM_MM = [
    "48549b2f502322effdd6055b24dff5e2753425c920587d857d69997c5b74d7a9",
    "324d4557122f518a8f85facf62b752987084f6ec67647a5ca4723188050276d9",
    "cee02d0b7ea3d63325b4bd3bd2c44fb371b3a17bea253101dfedde3d29a44d9c",
]
# list(range(12)), cache_salt="salty", sha256.
VLLM_SALT = [
    "513c2b766145656d51b44f7c529a32d76edbc0fe848dfce870386379468dea92",
    "a5a9c752479019644c57fd355dc62ac1296964186a767d68aaee8e53b1fab625",
    "01c07cee04f8209c988f60a5be0837c935f8702a6893e75088ceee94518c6a79",
]
# prompt_token_ids=None, prompt_embeds=torch.float32 tensor (6, 3) with row i = [i*0.5, -i*0.25, 1+i],
# then append_output_token_ids([7, 8, 9, 10, 11, 12]); sha256.  (vLLM sets the 6 prompt token ids to 0.)
VLLM_EMBEDS_F32 = [
    "e87216909f12d0cae3ea2553dfdd17c306a8a3910e10f5691ef0abbbf2a1de64",
    "df76456d9ea8849f5c207493fa6287d7f43f0441a9abf67cf0e806d497abe98f",
    "73608b14c366f47a97005709cd732b19b3ad4ec1f6c57ca127eb253e65d06a5f",
]
# The same embeddings cast to torch.bfloat16, no output tokens; sha256.
VLLM_EMBEDS_BF16 = ["559e11cb93ff24b6597c532445d803babaa9f664d3f1a6907df4c3f7d1d65554"]
# list(range(100, 112)), the LoRA, image and salt above together, sha256_cbor.
VLLM_CBOR_ALL = [
    "9277d93d032e077c1dcb887b338e8dd8d32bab546d49e4d31dd4a3509c7b2b0d",
    "282d04e2394f0a43e5038f92fc6bd99ee33760b4843b47856c1094b0c3e174b4",
    "c754329f1b5fd4a1f30c633358beef23e9e2c019b887fa0420fc56bd9be07f72",
]
# [2**70, -(2**70), 0, -1] (bignums), sha256_cbor.
VLLM_CBOR_BIGINT = ["41a7f2b3d295df8071f43955769932fc5ae81ba6df23a1beaba4716327b6a5e0"]

LORA = ("adapter-a", "/loras/a")
IMAGE = MMFeature("img-hash-1", offset=3, length=5)
EMBED_VALUES = [(i * 0.5, -i * 0.25, 1.0 + i) for i in range(6)]
EMBED_ROWS_F32 = tuple(struct.pack("<3f", *row) for row in EMBED_VALUES)
# bfloat16 is the high half of a float32; these values are exact in bfloat16.
EMBED_ROWS_BF16 = tuple(b"".join(struct.pack("<f", x)[2:] for x in row) for row in EMBED_VALUES)


def _hex(hashes: tuple[BlockHash, ...]) -> list[str]:
    return [h.hex() for h in hashes]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_none_hash_matches_vllm(algo: str) -> None:
    assert get_none_hash(algo).hex() == VLLM_NONE_HASH[algo]  # type: ignore[arg-type]


def test_none_hash_uses_pythonhashseed_when_given() -> None:
    assert get_none_hash("sha256", "42").hex() == VLLM_NONE_HASH_SHA256_SEED_42
    assert get_none_hash("sha256", "").hex() != VLLM_NONE_HASH["sha256"]  # "" is a seed, not "unset"


@pytest.mark.parametrize(
    ("tokens", "features", "algo", "expected"),
    [
        (list(range(14)), NO_FEATURES, "sha256", VLLM_CHAIN),
        (list(range(12)), HashFeatures(lora=LORA), "sha256", VLLM_LORA),
        (list(range(12)), HashFeatures(mm_features=(IMAGE,)), "sha256", VLLM_MM),
        (list(range(12)), HashFeatures(cache_salt="salty"), "sha256", VLLM_SALT),
        (
            [0] * 6 + [7, 8, 9, 10, 11, 12],
            HashFeatures(prompt_embeds=EMBED_ROWS_F32),
            "sha256",
            VLLM_EMBEDS_F32,
        ),
        ([0] * 6, HashFeatures(prompt_embeds=EMBED_ROWS_BF16), "sha256", VLLM_EMBEDS_BF16),
        (
            list(range(100, 112)),
            HashFeatures(lora=LORA, mm_features=(IMAGE,), cache_salt="salty"),
            "sha256_cbor",
            VLLM_CBOR_ALL,
        ),
        ([2**70, -(2**70), 0, -1], NO_FEATURES, "sha256_cbor", VLLM_CBOR_BIGINT),
    ],
    ids=["chain", "lora", "mm", "salt", "embeds-f32", "embeds-bf16", "cbor-all", "cbor-bigint"],
)
def test_block_hashes_match_vllm(tokens: list[int], features: HashFeatures, algo: str, expected: list[str]) -> None:
    assert _hex(extend_block_hashes((), tokens, features, 4, algo)) == expected  # type: ignore[arg-type]


def test_salt_changes_only_the_first_blocks_own_key() -> None:
    """The salted chain differs everywhere, but only block 0's extra keys changed: block 1's vLLM hash
    is the unsalted block 1 recomputed on the salted parent."""
    assert all(s != c for s, c in zip(VLLM_SALT, VLLM_CHAIN, strict=True))
    salted_b0 = BlockHash(bytes.fromhex(VLLM_SALT[0]))
    none = get_none_hash("sha256")
    b1 = hash_block_tokens(get_hash_fn("sha256"), none, salted_b0, [4, 5, 6, 7], None)
    assert b1.hex() == VLLM_SALT[1]


# ---------------------------------------------------------------------------------------------
# 2. Extra-key tuples (vLLM 0.33.0 generate_block_hash_extra_keys gave exactly these tuples).


def test_mm_extra_keys_are_block_relative() -> None:
    f = HashFeatures(mm_features=(IMAGE,))  # image covers tokens [3, 8)
    assert generate_block_extra_keys(f, 0, 4) == (("mm", "img-hash-1", 3),)
    assert generate_block_extra_keys(f, 4, 8) == (("mm", "img-hash-1", -1),)
    assert generate_block_extra_keys(f, 8, 12) is None
    assert generate_block_extra_keys(f, 6, 12) == (("mm", "img-hash-1", -3),)  # seen from the block at 6


def test_mm_extra_keys_list_every_item_in_the_block_in_order() -> None:
    items = (MMFeature("a", 1, 2), MMFeature("b", 3, 1), MMFeature("c", 6, 10), MMFeature("d", 20, 1))
    f = HashFeatures(mm_features=items)
    assert generate_block_extra_keys(f, 0, 8) == (("mm", "a", 1), ("mm", "b", 3), ("mm", "c", 6))
    assert generate_block_extra_keys(f, 8, 16) == (("mm", "c", -2),)
    assert generate_block_extra_keys(f, 16, 20) is None  # "c" ended at 16, "d" starts at 20
    assert generate_block_extra_keys(f, 20, 24) == (("mm", "d", 0),)


def test_salt_key_only_on_the_block_at_token_0() -> None:
    f = HashFeatures(cache_salt="salty")
    assert generate_block_extra_keys(f, 0, 4) == (("cache_salt", "salty"),)
    assert generate_block_extra_keys(f, 4, 8) is None
    assert generate_block_extra_keys(HashFeatures(cache_salt=""), 0, 4) is None  # empty salt is falsy


def test_extra_keys_order_is_lora_mm_salt_embeds() -> None:
    rows = tuple(bytes([i]) * 4 for i in range(8))
    f = HashFeatures(lora=LORA, mm_features=(IMAGE,), cache_salt="salty", prompt_embeds=rows)
    assert generate_block_extra_keys(f, 0, 4) == (
        ("lora", "adapter-a", "/loras/a"),
        ("mm", "img-hash-1", 3),
        ("cache_salt", "salty"),
        ("prompt_embeds", hashlib.sha256(b"".join(rows[0:4])).digest()),
    )
    assert generate_block_extra_keys(f, 8, 12) == (
        ("lora", "adapter-a", "/loras/a"),
        ("prompt_embeds", hashlib.sha256(b"").digest()),  # block past the prompt: empty slice, still keyed
    )


def test_prompt_embeds_keys_match_vllm_digests() -> None:
    """Digests vLLM 0.33.0 put in the float32 case's extra keys (blocks at 0, 4 and 8)."""
    f = HashFeatures(prompt_embeds=EMBED_ROWS_F32)
    expected = [
        "e05ddbb3de492f61e8f22176c3699318053feeaf427805dcd913efdf4e0dbb9e",
        "3b54b1a4cbe65f851a38f8030427f9e10b9bebc16685db00b9c6f064ededf68b",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ]
    for start, digest in zip((0, 4, 8), expected, strict=True):
        keys = generate_block_extra_keys(f, start, start + 4)
        assert keys == (("prompt_embeds", bytes.fromhex(digest)),)


def test_no_features_means_none() -> None:
    assert generate_block_extra_keys(NO_FEATURES, 0, 16) is None


def test_falsy_parent_means_none_hash() -> None:
    fn, none = get_hash_fn("sha256"), get_none_hash("sha256")
    first = hash_block_tokens(fn, none, None, [0, 1, 2, 3], None)
    assert first.hex() == VLLM_CHAIN[0]
    assert hash_block_tokens(fn, none, BlockHash(b""), [0, 1, 2, 3], None) == first


@pytest.mark.parametrize(
    "bad",
    [
        lambda: HashFeatures(mm_features=(MMFeature("a", 4, 2), MMFeature("b", 2, 1))),  # unsorted
        lambda: HashFeatures(mm_features=(MMFeature("a", 0, 4), MMFeature("b", 3, 1))),  # overlapping
        lambda: HashFeatures(mm_features=(MMFeature("a", 0, 0),)),  # empty
        lambda: HashFeatures(lora=("only-name",)),  # type: ignore[arg-type]
        lambda: HashFeatures(prompt_embeds=("not bytes",)),  # type: ignore[arg-type]
        lambda: extend_block_hashes((), [1, 2], NO_FEATURES, 0, "sha256"),
        lambda: extend_block_hashes((BlockHash(b"x"),), [1, 2], NO_FEATURES, 4, "sha256"),
        lambda: get_hash_fn("md5"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        bad()  # type: ignore[operator]


# ---------------------------------------------------------------------------------------------
# 3. Incremental == from scratch.

tokens_st = st.lists(st.integers(0, 2**20), max_size=60)
hbs_st = st.integers(1, 8)
algo_st = st.sampled_from(["sha256", "sha256_cbor"])


@st.composite
def mm_features_st(draw: st.DrawFn, max_pos: int = 60) -> tuple[MMFeature, ...]:
    items, pos = [], 0
    for i in range(draw(st.integers(0, 4))):
        offset = pos + draw(st.integers(0, 12))
        length = draw(st.integers(1, 12))
        if offset >= max_pos:
            break
        items.append(MMFeature(draw(st.sampled_from(["img-0", "img-1", "vid-2"])) + f"#{i}", offset, length))
        pos = offset + length
    return tuple(items)


@st.composite
def features_st(draw: st.DrawFn) -> HashFeatures:
    lora = draw(st.none() | st.tuples(st.text(max_size=5), st.text(min_size=1, max_size=5)))
    salt = draw(st.none() | st.text(max_size=5))
    width = draw(st.integers(0, 6))
    embeds = draw(st.none() | st.lists(st.binary(min_size=width, max_size=width), max_size=40).map(tuple))
    return HashFeatures(lora=lora, mm_features=draw(mm_features_st()), cache_salt=salt, prompt_embeds=embeds)


@settings(max_examples=150, deadline=None)
@given(tokens=tokens_st, cuts=st.lists(st.integers(0, 60), max_size=5), f=features_st(), hbs=hbs_st, algo=algo_st)
def test_incremental_equals_from_scratch(
    tokens: list[int], cuts: list[int], f: HashFeatures, hbs: int, algo: str
) -> None:
    scratch = extend_block_hashes((), tokens, f, hbs, algo)  # type: ignore[arg-type]
    assert len(scratch) == len(tokens) // hbs
    hashes: tuple[BlockHash, ...] = ()
    for n in sorted(min(c, len(tokens)) for c in cuts) + [len(tokens)]:
        hashes = extend_block_hashes(hashes, tokens[:n], f, hbs, algo)  # type: ignore[arg-type]
        assert hashes == scratch[: n // hbs]
    assert hashes == scratch


@settings(max_examples=100, deadline=None)
@given(tokens=tokens_st.filter(lambda t: len(t) >= 2), f=features_st(), hbs=hbs_st, algo=algo_st)
def test_chain_is_prefix_determined(tokens: list[int], f: HashFeatures, hbs: int, algo: str) -> None:
    """Changing one token changes the hash of its block and of every later block, and nothing before."""
    hashes = extend_block_hashes((), tokens, f, hbs, algo)  # type: ignore[arg-type]
    pos = len(tokens) // 2
    other = tokens[:pos] + [tokens[pos] + 1] + tokens[pos + 1 :]
    changed = extend_block_hashes((), other, f, hbs, algo)  # type: ignore[arg-type]
    k = pos // hbs
    assert changed[:k] == hashes[:k]
    assert all(a != b for a, b in zip(changed[k:], hashes[k:], strict=True))


# ---------------------------------------------------------------------------------------------
# 5. The CBOR encoder against cbor2 with vLLM 0.33.0's options (sha256_cbor: cbor2.dumps(x, canonical=True)).

cbor_leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**130), 2**130)
    | st.sampled_from([23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64, -(2**64), -(2**64) - 1])
    | st.binary(max_size=300)
    | st.text(max_size=300)
)
cbor_value = st.recursive(
    cbor_leaf, lambda inner: st.lists(inner, max_size=30) | st.lists(inner).map(tuple), max_leaves=80
)


@settings(max_examples=300, deadline=None)
@given(cbor_value)
def test_canonical_cbor_matches_cbor2(value: object) -> None:
    cbor2 = pytest.importorskip("cbor2")
    assert canonical_cbor(value) == cbor2.dumps(value, canonical=True)


@pytest.mark.parametrize("value", [1.5, {"a": 1}, {1, 2}, bytearray(b"x")])
def test_canonical_cbor_refuses_other_types(value: object) -> None:
    with pytest.raises(TypeError):
        canonical_cbor(value)


# ---------------------------------------------------------------------------------------------
# 4. Differential test against a real vLLM Request.


@pytest.fixture(scope="module")
def vllm_api() -> dict[str, Any]:
    pytest.importorskip("vllm")
    import torch
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    def make_request(prompt: list[int] | None, f: HashFeatures, hbs: int, algo: str, embeds: Any = None) -> Any:
        fn = {"sha256": sha256, "sha256_cbor": sha256_cbor}[algo]
        init_none_hash(fn)
        mm = [
            MultiModalFeatureSpec(
                data=None,
                modality="image",
                identifier=m.identifier,
                mm_position=PlaceholderRange(m.offset, m.length),
            )
            for m in f.mm_features
        ]
        lora = None if f.lora is None else LoRARequest(lora_name=f.lora[0], lora_int_id=1, lora_path=f.lora[1])
        return Request(
            request_id="r",
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=8),
            pooling_params=None,
            prompt_embeds=embeds,
            mm_features=mm or None,
            lora_request=lora,
            cache_salt=f.cache_salt,
            block_hasher=get_request_block_hasher(hbs, fn),
        )

    return {"make_request": make_request, "torch": torch}


@st.composite
def vllm_case_st(draw: st.DrawFn) -> tuple[list[int], HashFeatures, bool, int, str, list[list[int]]]:
    prompt = draw(st.lists(st.integers(0, 2**17), min_size=1, max_size=40))
    use_embeds = draw(st.booleans()) and draw(st.booleans())
    lora = draw(st.none() | st.tuples(st.text(max_size=4), st.text(min_size=1, max_size=6)))
    salt = draw(st.none() | st.text(max_size=4))
    f = HashFeatures(lora=lora, mm_features=draw(mm_features_st(max_pos=len(prompt))), cache_salt=salt)
    outputs = draw(st.lists(st.lists(st.integers(0, 2**17), min_size=1, max_size=6), max_size=5))
    return prompt, f, use_embeds, draw(hbs_st), draw(algo_st), outputs


@pytest.mark.vllm
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=vllm_case_st(), seed=st.integers(0, 2**16))
def test_matches_vllm_request_block_hashes(
    vllm_api: dict[str, Any],
    case: tuple[list[int], HashFeatures, bool, int, str, list[list[int]]],
    seed: int,
) -> None:
    prompt, f, use_embeds, hbs, algo, outputs = case
    torch = vllm_api["torch"]
    make_request = vllm_api["make_request"]
    embeds = None
    if use_embeds:  # vLLM zeroes the token ids of an embeddings-only prompt
        gen = torch.Generator().manual_seed(seed)
        embeds = torch.randn(len(prompt), 3, generator=gen, dtype=torch.float32)  # [P, 3]
        rows = tuple(embeds[i].numpy().tobytes() for i in range(len(prompt)))
        f = HashFeatures(lora=f.lora, mm_features=f.mm_features, cache_salt=f.cache_salt, prompt_embeds=rows)
        prompt = [0] * len(prompt)
    req = make_request(None if use_embeds else list(prompt), f, hbs, algo, embeds)
    seed_env = os.environ.get("PYTHONHASHSEED")  # vLLM's init_none_hash reads it
    tokens = list(prompt)
    ours = extend_block_hashes((), tokens, f, hbs, algo, seed_env)  # type: ignore[arg-type]
    assert _hex(ours) == _hex(tuple(req.block_hashes))
    for out in outputs:
        req.append_output_token_ids(out if len(out) > 1 else out[0])
        tokens += out
        ours = extend_block_hashes(ours, tokens, f, hbs, algo, seed_env)  # type: ignore[arg-type]
        assert _hex(ours) == _hex(tuple(req.block_hashes))
        assert len(ours) == len(tokens) // hbs


@pytest.mark.vllm
def test_pickle_string_identity_quirk_matches_vllm(vllm_api: dict[str, Any]) -> None:
    """sha256 pickles; pickle memoises a str object seen twice.  A LoRA whose name *is* its path
    object hashes differently from one whose path is an equal but distinct string, in vLLM and here;
    sha256_cbor does not care."""
    make_request = vllm_api["make_request"]
    name = "adapter"
    same, distinct = (name, name), (name, "".join(["adap", "ter"]))
    assert distinct[1] is not name
    seed_env = os.environ.get("PYTHONHASHSEED")
    for algo, should_differ in (("sha256", True), ("sha256_cbor", False)):
        got = {}
        for label, lora in (("same", same), ("distinct", distinct)):
            f = HashFeatures(lora=lora)
            vllm_hashes = _hex(tuple(make_request(list(range(8)), f, 4, algo).block_hashes))
            assert _hex(extend_block_hashes((), list(range(8)), f, 4, algo, seed_env)) == vllm_hashes  # type: ignore[arg-type]
            got[label] = vllm_hashes
        assert (got["same"] != got["distinct"]) == should_differ
