"""What a KV slot holds: an exact, interned identity (docs/semantics.md §11.1).

The K and V a model writes for position ``p`` are a function of the tokens ``0..p`` and of what
else changes the numbers there: the LoRA adapter (every position), the multimodal item and the
offset inside it at a placeholder position, the prompt-embedding row of an embeddings prompt.
``cache_salt`` changes no number, so it is no part of the identity (a salt separates tenants'
hashes, not their KV).  An identity is a node of a prefix trie, interned: equal prefixes get equal
ids across requests, and comparing what a slot holds with what a reader expects is one int
comparison.

Two more kinds of identity: a *pending* one for a position computed before its token is known
(an async-scheduling placeholder, a padded draft slot; one per request and position), and an
*encoder* one for a cross-attention position (the encoder input's identifier and the offset in it).

``IdentityTrie`` is a memo table (the same question always gets the same answer);
``SequenceIdentities`` caches one request's verified positions, which never change once known.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NewType

from spec.hashing import HashFeatures, MMFeature

KVIdentity = NewType("KVIdentity", int)
"""An interned identity: equal ids hold interchangeable KV."""

PositionKey = Hashable
"""What one position adds to its prefix: the token, or (token, multimodal key, embedding row)."""

_SEQUENCE_ROOT = -1
_PENDING_ROOT = -2
_ENCODER_ROOT = -3


def get_mm_key(position: int, items: Sequence[MMFeature]) -> tuple[str, int] | None:
    """The multimodal item covering ``position`` and the offset inside it, or None."""
    for m in items:
        if m.offset <= position < m.offset + m.length:
            return (m.identifier, position - m.offset)
    return None


def get_position_key(token: int, position: int, features: HashFeatures) -> PositionKey:
    """What position ``position`` holding ``token`` adds to its prefix (§11.1): the token, and
    the multimodal item and embedding row there when the request has them; never the salt."""
    assert position >= 0, f"position must be >= 0, got {position}"
    mm = get_mm_key(position, features.mm_features) if features.mm_features else None
    embeds = features.prompt_embeds
    row = embeds[position] if embeds is not None and position < len(embeds) else None
    if mm is None and row is None:
        return token
    return (token, mm, row)


class IdentityTrie:
    """The interned prefix trie of one run: a node per (parent, position key).

    ``origin`` names, for a witness, the kind of each node and the first (request, position)
    that asked for it."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, Hashable], KVIdentity] = {}
        self.origin: dict[KVIdentity, tuple[str, str, int]] = {}

    def _intern(self, parent: int, key: Hashable, origin: tuple[str, str, int]) -> KVIdentity:
        node = self._nodes.get((parent, key))
        if node is None:
            node = self._nodes[(parent, key)] = KVIdentity(len(self._nodes))
            self.origin[node] = origin
        return node

    def describe(self, identity: KVIdentity | None) -> str:
        """``"unwritten"``, or what the node stands for, named by the first request that had it."""
        if identity is None:
            return "unwritten"
        kind, rid, p = self.origin[identity]
        return f"{kind} #{identity} (first: {rid} position {p})"

    def get_root(self, lora: tuple[str, str] | None, request_id: str) -> KVIdentity:
        """The empty prefix of a request: one per LoRA adapter (LoRA changes every position)."""
        return self._intern(_SEQUENCE_ROOT, ("lora", lora), ("empty prefix", request_id, -1))

    def get_child(self, parent: KVIdentity, key: PositionKey, request_id: str, position: int) -> KVIdentity:
        """The prefix ``parent`` extended by one position holding ``key`` (§11.1)."""
        return self._intern(parent, key, ("prefix", request_id, position))

    def get_pending(self, request_id: str, position: int) -> KVIdentity:
        """A position computed before its token is known (§11.1)."""
        return self._intern(_PENDING_ROOT, (request_id, position), ("pending", request_id, position))

    def get_encoder(self, item: MMFeature, position: int, request_id: str) -> KVIdentity:
        """Cross-attention position ``position`` of the encoder input ``item``."""
        assert item.offset <= position < item.offset + item.length, f"{position} is outside {item}"
        return self._intern(_ENCODER_ROOT, (item.identifier, position - item.offset), ("encoder", request_id, position))

    def is_pending(self, identity: KVIdentity) -> bool:
        """Stands for a position whose token was not known when it was computed."""
        return self.origin[identity][0] == "pending"


class SequenceIdentities:
    """The identities of one request's positions (§11.1).

    Verified positions (``all_token_ids``) never change, so they are computed once; drafts and
    positions whose token is not known yet are derived per call."""

    def __init__(self, trie: IdentityTrie, request_id: str, features: HashFeatures) -> None:
        self.trie = trie
        self.request_id = request_id
        self.features = features
        self.root = trie.get_root(features.lora, request_id)
        self.verified: list[KVIdentity] = []

    def _extend(self, tokens: Sequence[int], num_verified: int) -> None:
        ids, trie, rid, features = self.verified, self.trie, self.request_id, self.features
        parent = ids[-1] if ids else self.root
        for p in range(len(ids), num_verified):
            parent = trie.get_child(parent, get_position_key(tokens[p], p, features), rid, p)
            ids.append(parent)

    def get_identities(self, tokens: Sequence[int], num_verified: int, end: int) -> list[KVIdentity]:
        """Identities of positions ``[0, end)``: ``tokens[:num_verified]`` are verified, the rest of
        ``tokens`` are drafts, and positions past ``tokens`` are pending."""
        assert 0 <= num_verified <= len(tokens), f"{num_verified} verified of {len(tokens)} tokens"
        self._extend(tokens, num_verified)
        out = self.verified[: min(end, num_verified)]
        parent = out[-1] if out else self.root
        for p in range(len(out), end):
            if p < len(tokens):
                key = get_position_key(tokens[p], p, self.features)
                parent = self.trie.get_child(parent, key, self.request_id, p)
            else:
                parent = self.trie.get_pending(self.request_id, p)
            out.append(parent)
        return out
