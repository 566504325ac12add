"""What a KV slot holds: an exact, interned identity (docs/semantics.md §11.1).

The K and V a model writes for position ``p`` are a function of the tokens ``0..p`` and of what
else changes the numbers there: the LoRA adapter (every position; its name *and* path: two adapters
may share a name), the multimodal item and the offset inside it at a placeholder position, the
prompt-embedding row of an embeddings prompt.  The ``cache_salt`` changes no number, but it names
the tenant the KV was computed for, which no other tenant may read; it is part of the identity too.
An identity is a node of a prefix trie, interned: equal prefixes get equal ids across requests, and
comparing what a slot holds with what a reader expects is one int comparison.  ``explain`` names
what separates two identities (for witnesses and the known-bug registry).

Two more kinds of identity: a *pending* one for a position computed before its token is known
(an async-scheduling placeholder, a padded draft slot; one per request and position), and an
*encoder* one for a cross-attention position (the encoder input's identifier and the offset in it).

``IdentityTrie`` is a memo table (the same question always gets the same answer);
``SequenceIdentities`` caches one request's verified positions, which never change once known.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NewType

from kvspec.spec.hashing import HashFeatures, MMFeature

Difference = str
"""What separates the KV a slot holds from the KV a reader needs (``IdentityTrie.explain``):
``lora-path`` (one adapter name, another path), ``lora`` (another adapter, or none), ``cache-salt``
(another tenant), ``tokens``, ``mm`` (a multimodal item or the offset in it), ``prompt-embeds`` (at
the first position that differs, checked in that order), ``position`` (the KV of another position),
``pending``, ``encoder``, ``unwritten``."""

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
        self._links: list[tuple[int, Hashable]] = []  # node -> (parent, key), for ``explain``
        self.origin: dict[KVIdentity, tuple[str, str, int]] = {}

    def _intern(self, parent: int, key: Hashable, origin: tuple[str, str, int]) -> KVIdentity:
        node = self._nodes.get((parent, key))
        if node is None:
            node = self._nodes[(parent, key)] = KVIdentity(len(self._nodes))
            self._links.append((parent, key))
            self.origin[node] = origin
        return node

    def describe(self, identity: KVIdentity | None) -> str:
        """``"unwritten"``, or what the node stands for, named by the first request that had it."""
        if identity is None:
            return "unwritten"
        kind, rid, p = self.origin[identity]
        return f"{kind} #{identity} (first: {rid} position {p})"

    def get_root(self, lora: tuple[str, str] | None, cache_salt: str | None, request_id: str) -> KVIdentity:
        """The empty prefix of a request: one per LoRA adapter (name and path: LoRA changes every
        position) and tenant (cache salt; an empty salt is none, as in vLLM's keys)."""
        return self._intern(_SEQUENCE_ROOT, ("context", lora, cache_salt or None), ("empty prefix", request_id, -1))

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

    def _chain(self, identity: KVIdentity) -> tuple[object, object, list[Hashable]]:
        """A prefix node's LoRA adapter and salt (its root) and its position keys, first position first."""
        keys = []
        node: int = identity
        while self._links[node][0] >= 0:
            parent, key = self._links[node]
            keys.append(key)
            node = parent
        root = self._links[node][1]
        assert isinstance(root, tuple) and root[0] == "context", f"identity {identity} is not a prefix"
        return root[1], root[2], keys[::-1]

    def explain(self, expected: KVIdentity, held: KVIdentity | None) -> Difference | None:
        """What separates ``held`` from ``expected`` (``Difference``), None when they are equal.
        Only for findings: it walks both prefixes."""
        if held is None:
            return "unwritten"
        if held == expected:
            return None
        kinds = (self.origin[held][0], self.origin[expected][0])
        for kind in ("pending", "encoder"):
            if kind in kinds:
                return kind
        lora_e, salt_e, keys_e = self._chain(expected)
        lora_h, salt_h, keys_h = self._chain(held)
        if lora_e != lora_h:
            same_name = isinstance(lora_e, tuple) and isinstance(lora_h, tuple) and lora_e[0] == lora_h[0]
            return "lora-path" if same_name else "lora"
        if salt_e != salt_h:
            return "cache-salt"
        if len(keys_e) != len(keys_h):
            return "position"
        for ke, kh in zip(keys_e, keys_h, strict=True):
            if ke != kh:
                (te, mme, _), (th, mmh, _) = _parts(ke), _parts(kh)
                return "tokens" if te != th else "mm" if mme != mmh else "prompt-embeds"
        raise AssertionError("two identities with equal prefixes are one node")


def _parts(key: Hashable) -> tuple[object, object, object]:
    """(token, multimodal key, embedding row) of a position key (``get_position_key``)."""
    if isinstance(key, tuple):
        token, mm, row = key
        return token, mm, row
    return key, None, None


class SequenceIdentities:
    """The identities of one request's positions (§11.1).

    Verified positions (``all_token_ids``) never change, so they are computed once; drafts and
    positions whose token is not known yet are derived per call."""

    def __init__(self, trie: IdentityTrie, request_id: str, features: HashFeatures) -> None:
        self.trie = trie
        self.request_id = request_id
        self.features = features
        self.root = trie.get_root(features.lora, features.cache_salt, request_id)
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
