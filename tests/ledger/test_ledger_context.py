"""What a position's KV identity records beside its tokens (docs/semantics.md §11.1): the LoRA adapter
by name and path, the tenant (cache salt), the multimodal items and embeddings of the whole prefix;
and ``IdentityTrie.explain``, which names what separates two identities in a finding."""

from __future__ import annotations

import pytest

from kvspec.harness.ledger.known_bugs import KNOWN_BUGS, get_known_bug, match_known_bug
from kvspec.spec.hashing import HashFeatures, MMFeature
from kvspec.spec.kv_ledger import IdentityTrie, SequenceIdentities

TOKENS = [1, 2, 3, 1]


def ids(trie: IdentityTrie, rid: str, features: HashFeatures, tokens: list[int] = TOKENS) -> list[int]:
    return SequenceIdentities(trie, rid, features).get_identities(tokens, len(tokens), len(tokens))


@pytest.mark.parametrize(
    "a, b, differs",
    [
        (HashFeatures(lora=("a", "/p1")), HashFeatures(lora=("a", "/p2")), "lora-path"),
        (HashFeatures(lora=("a", "/p1")), HashFeatures(lora=("b", "/p1")), "lora"),
        (HashFeatures(lora=("sql", "/p")), HashFeatures(cache_salt="sql"), "lora"),
        (HashFeatures(cache_salt="t1"), HashFeatures(cache_salt="t2"), "cache-salt"),
        (HashFeatures(), HashFeatures(cache_salt="t1"), "cache-salt"),
        (HashFeatures(mm_features=(MMFeature("x", 1, 1),)), HashFeatures(mm_features=(MMFeature("y", 1, 1),)), "mm"),
        (
            HashFeatures(mm_features=(MMFeature("x", 0, 1), MMFeature("z", 2, 1))),
            HashFeatures(mm_features=(MMFeature("z", 2, 1),)),
            "mm",
        ),
        (
            HashFeatures(prompt_embeds=(b"a",) * 4),
            HashFeatures(prompt_embeds=(b"a", b"b", b"a", b"a")),
            "prompt-embeds",
        ),
    ],
)
def test_every_position_after_a_difference_differs_and_says_why(a: HashFeatures, b: HashFeatures, differs: str) -> None:
    trie = IdentityTrie()
    x, y = ids(trie, "r1", a), ids(trie, "r2", b)
    assert x[-1] != y[-1]
    assert trie.explain(y[-1], x[-1]) == differs


def test_equal_contexts_share_identities_and_an_empty_salt_is_none() -> None:
    trie = IdentityTrie()
    assert ids(trie, "r1", HashFeatures(cache_salt="")) == ids(trie, "r2", HashFeatures())
    assert trie.explain(ids(trie, "r1", HashFeatures())[-1], ids(trie, "r2", HashFeatures())[-1]) is None


def test_other_tokens_and_other_positions() -> None:
    trie = IdentityTrie()
    x, y = ids(trie, "r1", HashFeatures()), ids(trie, "r2", HashFeatures(), [1, 2, 2, 1])
    assert trie.explain(y[3], x[3]) == "tokens"
    assert trie.explain(y[3], x[2]) == "position"
    assert trie.explain(y[3], None) == "unwritten"
    assert trie.explain(y[3], trie.get_pending("r1", 3)) == "pending"


def test_known_bugs_match_only_in_the_releases_they_affect() -> None:
    k4 = get_known_bug("K4")
    sig = {
        "invariant": "kv_read_own_kv",
        "source": "prefix-hit",
        "differs": "lora-path",
        "group_kind": "full",
        "recompute": None,
        "chunk_multiple_of_block": None,
    }
    assert match_known_bug({**sig, "release": "0.30.0"}) is k4
    assert match_known_bug({**sig, "release": "0.31.0"}) is None  # fixed: a finding again
    assert match_known_bug(sig) is k4 and match_known_bug({**sig, "release": None}) is k4  # what-if profiles
    assert match_known_bug({**sig, "release": "0.30.0", "source": "computed"}) is None
    for bug in KNOWN_BUGS:
        assert bug.fixed_in is None or bug.fixed_in not in bug.affected_releases
