"""``spec.kv_ledger``: identities, attention spans, the slot store and the registry (docs/semantics.md §11)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvspec.spec.config import chunked_local, cross_attention, full_attention, sliding_window
from kvspec.spec.hashing import NO_FEATURES, HashFeatures, MMFeature
from kvspec.spec.kv_ledger import (
    LEDGER_INVARIANTS,
    IdentityTrie,
    KVLedger,
    LedgerContext,
    SequenceIdentities,
    SlotAccess,
    check_ledger,
    clear_block,
    get_first_reader,
    get_first_visible,
    get_held,
    get_promised_end,
    get_run_span,
    write_slot,
)
from kvspec.spec.types import BlockId

SEMANTICS = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"


def ids(trie: IdentityTrie, rid: str, tokens: tuple[int, ...], features: HashFeatures = NO_FEATURES) -> list[int]:
    return SequenceIdentities(trie, rid, features).get_identities(tokens, len(tokens), len(tokens))


def test_equal_prefixes_equal_identities_across_requests():
    t = IdentityTrie()
    a, b = ids(t, "a", (1, 2, 3, 4)), ids(t, "b", (1, 2, 9, 4))
    assert a[:2] == b[:2] and a[2] != b[2]
    assert a[3] != b[3]  # same token, different prefix


def test_lora_mm_embeds_and_the_salt_change_the_identity():
    """The salt changes no number but names the tenant, which no other tenant may read (§11.1)."""
    t = IdentityTrie()
    plain = ids(t, "p", (1, 2, 3))
    assert ids(t, "s", (1, 2, 3), HashFeatures(cache_salt="tenant-a"))[0] != plain[0]
    assert ids(t, "s0", (1, 2, 3), HashFeatures(cache_salt="")) == plain
    assert ids(t, "l", (1, 2, 3), HashFeatures(lora=("sql", "/l")))[0] != plain[0]
    assert (
        ids(t, "l2", (1, 2, 3), HashFeatures(lora=("sql", "/l2")))[0]
        != ids(t, "l", (1, 2, 3), HashFeatures(lora=("sql", "/l")))[0]
    )
    mm = ids(t, "m", (1, 2, 3), HashFeatures(mm_features=(MMFeature("img-a", 1, 1),)))
    assert mm[0] == plain[0] and mm[1] != plain[1] and mm[2] != plain[2]
    emb = ids(t, "e", (0, 0, 0), HashFeatures(prompt_embeds=(b"a", b"b", b"c")))
    assert emb != ids(t, "z", (0, 0, 0)) and emb == ids(
        t, "e2", (0, 0, 0), HashFeatures(prompt_embeds=(b"a", b"b", b"c"))
    )


def test_drafts_and_pending_positions():
    t = IdentityTrie()
    s = SequenceIdentities(t, "r", HashFeatures())
    verified = s.get_identities((1, 2), 2, 2)
    with_draft = s.get_identities((1, 2, 7), 2, 4)  # position 2 is a draft, 3 is not known yet
    assert with_draft[:2] == verified and with_draft[2] == ids(t, "q", (1, 2, 7))[2]
    assert with_draft[3] == t.get_pending("r", 3) and t.is_pending(with_draft[3])
    assert t.get_pending("other", 3) != with_draft[3]


def test_encoder_identity_is_the_input_and_offset():
    t = IdentityTrie()
    item = MMFeature("audio-4", 0, 4)
    assert t.get_encoder(item, 2, "a") == t.get_encoder(MMFeature("audio-4", 0, 4), 2, "b")
    assert t.get_encoder(item, 2, "a") != t.get_encoder(MMFeature("audio-5", 0, 5), 2, "a")


@pytest.mark.parametrize(
    ("spec", "p", "first"),
    [
        (full_attention(4), 9, 0),
        (sliding_window(4, 3), 9, 7),
        (sliding_window(4, 3), 1, 0),
        (chunked_local(2, 5), 4, 0),
        (chunked_local(2, 5), 5, 5),
        (chunked_local(2, 5), 9, 5),
    ],
)
def test_attention_spans(spec, p, first):
    assert get_first_visible(spec, p) == first
    assert get_run_span(spec, p, p + 1) == range(first, p + 1)


def test_run_span_is_the_union_and_first_reader():
    sw = sliding_window(2, 3)
    assert get_run_span(sw, 4, 8) == range(2, 8)
    assert get_first_reader(sw, 4, 8, 2) == 4 and get_first_reader(sw, 4, 8, 5) == 5
    with pytest.raises(AssertionError):
        get_first_visible(cross_attention(2), 3)


def test_slot_store_writes_clears_and_ignores_nothing():
    ledger = KVLedger()
    write_slot(ledger, BlockId(3), 1, 42)  # type: ignore[arg-type]
    assert get_held(ledger, BlockId(3), 1) == 42 and get_held(ledger, BlockId(3), 0) is None
    clear_block(ledger, BlockId(3))
    assert get_held(ledger, BlockId(3), 1) is None
    with pytest.raises(AssertionError):
        write_slot(ledger, BlockId(0), 0, 1)  # type: ignore[arg-type]


def test_promised_end():
    assert get_promised_end(0, 4, 8, 3, delay_cache_blocks=False) == 15
    assert get_promised_end(0, 4, 8, 0, delay_cache_blocks=True) == 4


def access(**kw):
    base = dict(request_id="r", group=0, position=0, token=0, block=1, offset=0, expected=5, held=5, shared=False)
    return SlotAccess(**{**base, **kw})


@pytest.mark.parametrize(
    ("kind", "acc", "name"),
    [
        ("write", access(block=0), "kv_write_in_real_block"),
        ("write", access(block=None), "kv_write_in_real_block"),
        ("write", access(block=9), "kv_write_in_real_block"),  # outside a pool of 8
        ("write", access(shared=True, held=4), "kv_write_keeps_shared"),
        ("write", access(shared=True, held=None), None),  # fulfilling a promise
        ("write", access(shared=True, held=5), None),  # the same identity again
        ("read", access(block=0, held=None), "kv_read_in_real_block"),
        ("read", access(held=None), "kv_read_written"),
        ("read", access(held=4), "kv_read_own_kv"),
        ("publish", access(held=None), "kv_publish_written"),
        ("read", access(), None),
    ],
)
def test_registry_predicates(kind, acc, name):
    v = check_ledger(LedgerContext(kind, [access(position=1), acc], 8))
    assert (v.name if v else None) == name
    if v is not None:
        assert v.access == acc and v.rule.startswith("§11")


def test_every_invariant_is_named_in_the_semantics():
    text = SEMANTICS.read_text(encoding="utf-8")
    section = text[text.index('<a id="s11"></a>') :]
    for name, inv in LEDGER_INVARIANTS.items():
        assert f"`{name}`" in section, name
        assert re.fullmatch(r"§11\.\d", inv.rule) and inv.doc
