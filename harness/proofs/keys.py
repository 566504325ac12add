"""Claims about block keys: what enters the hash, and weak key functions a manager might use.

The real key of a block is ``make_block_key(hash_fn((parent, tuple(tokens), extra_keys)), gid)``
(vLLM 0.33 ``hash_block_tokens`` + ``make_block_hash_with_group_id``).  SHA-256 over a pickle is
not something Z3 can reason about, and needs not be: a collision-resistant hash of an injective
encoding is what the design relies on.  What can go wrong in a manager is the *encoding*: a field
left out, an untagged field that can impersonate another, a truncated token.  So the claims are:

* ``keys.hash_input_injective``: the object ``spec.hashing.hash_block_tokens`` hands to the hash
  function (obtained by running the real ``generate_block_extra_keys`` and ``hash_block_tokens``
  with an identity "hash") determines the block's meaning: parent, tokens, LoRA (name, path), cache
  salt (first block), and every overlapping multimodal item (identifier, block-relative offset).
  The spec's code runs on concrete layouts with placeholder strings standing for symbolic ones
  (the code never inspects the strings, only passes them through, so a placeholder is as good as
  any value; the salt's truthiness is a premise: a salt is a non-empty string).  Bound: blocks of
  4 tokens at positions 0 and 4, with or without LoRA and salt, 0-2 multimodal items in 6-7 layouts
  per position, every pair of such requests.  Pickle of nested tuples of str/int/None is
  injective (it round-trips), so equal pickles need equal objects.
* ``keys.block_key_injective``: ``make_block_key`` (run on symbolic byte strings) maps different
  (32-byte hash, group id) pairs to different keys, and ``get_block_hash`` recovers the hash.
* ``keys.polynomial_key_collides`` and ``keys.truncated_token_key_collides``: existence claims; Z3
  exhibits two different token blocks with the same key for the weak key functions below (the
  witness is re-checked on Python ints).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import z3

from kvspec.harness.proofs.core import COUNTEREXAMPLE, PROVEN, UNKNOWN, Claim, Outcome, find_witness
from kvspec.spec import hashing, types

BLOCK = 4  # tokens per block in the injectivity claim

# --- the real hash input, with placeholders ----------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One request shape for the block ``[start, start + BLOCK)``: which features it has, and the
    multimodal items as (offset, length) pairs (identifiers are symbolic)."""

    tag: str  # names the Z3 variables of this side ("a" or "b")
    start: int
    lora: bool
    salt: bool
    mm: tuple[tuple[int, int], ...]

    def placeholder(self, field: str) -> str:
        return f"\u27e8{self.tag}:{field}\u27e9"


def _mm_layouts(start: int) -> list[tuple[tuple[int, int], ...]]:
    end = start + BLOCK
    layouts = [(), ((start + 1, 2),), ((start + 2, 2),), ((start, 1), (start + 2, 2)), ((end, 2),), ((start + 3, 5),)]
    if start > 0:
        layouts.append(((start - 2, 3),))  # began in the previous block
    return layouts


def cases(tag: str) -> list[Case]:
    return [
        Case(tag, start, lora, salt, mm)
        for start in (0, BLOCK)
        for lora, salt in itertools.product((False, True), repeat=2)
        for mm in _mm_layouts(start)
    ]


class Sym:
    """Symbolic variables of one side, created on first use by name."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.vars: dict[str, z3.ExprRef] = {}

    def string(self, name: str) -> z3.ExprRef:
        return self.vars.setdefault(name, z3.String(f"{self.tag}.{name}"))

    def int(self, name: str) -> z3.ExprRef:
        return self.vars.setdefault(name, z3.Int(f"{self.tag}.{name}"))


def hash_input(case: Case, sym: Sym) -> Any:
    """The object the spec hashes for this block, as a tree whose leaves are Z3 terms."""
    features = hashing.HashFeatures(
        lora=(case.placeholder("lora_name"), case.placeholder("lora_path")) if case.lora else None,
        mm_features=tuple(
            hashing.MMFeature(case.placeholder(f"mm{j}"), off, length) for j, (off, length) in enumerate(case.mm)
        ),
        cache_salt=case.placeholder("salt") if case.salt else None,
    )
    tokens = [sym.int(f"t{j}") for j in range(BLOCK)]
    parent = case.placeholder("parent") if case.start > 0 else None
    none_hash = types.BlockHash(b"NONE_HASH")
    extra = hashing.generate_block_extra_keys(features, case.start, case.start + BLOCK)
    obj = hashing.hash_block_tokens(lambda o: o, none_hash, parent, tokens, extra)  # type: ignore[arg-type,return-value]
    return _symbolize(obj, case, sym)


def _symbolize(obj: Any, case: Case, sym: Sym) -> Any:
    if isinstance(obj, tuple):
        return tuple(_symbolize(x, case, sym) for x in obj)
    prefix = case.placeholder("")[:-1]
    if isinstance(obj, str) and obj.startswith(prefix):
        return sym.string(obj[len(prefix) : -1])
    return obj


def _leaf_kind(x: Any) -> str:
    if isinstance(x, (str, bytes)) or (isinstance(x, z3.ExprRef) and x.sort() == z3.StringSort()):
        return "bytes" if isinstance(x, bytes) else "str"
    if x is None:
        return "none"
    return "int"


def struct_eq(x: Any, y: Any) -> z3.BoolRef:
    """Z3 condition for two trees to be the same Python object (so the same pickle)."""
    if isinstance(x, tuple) or isinstance(y, tuple):
        if not (isinstance(x, tuple) and isinstance(y, tuple)) or len(x) != len(y):
            return z3.BoolVal(False)
        return z3.And(*[struct_eq(a, b) for a, b in zip(x, y)]) if x else z3.BoolVal(True)
    kx, ky = _leaf_kind(x), _leaf_kind(y)
    if kx != ky:
        return z3.BoolVal(False)
    if kx == "none":
        return z3.BoolVal(True)
    if kx == "bytes":
        return z3.BoolVal(x == y)
    if kx == "str":
        x = z3.StringVal(x) if isinstance(x, str) else x
        y = z3.StringVal(y) if isinstance(y, str) else y
    return x == y


def meaning(case: Case, sym: Sym) -> tuple[Any, ...]:
    """What the KV of this block depends on, written from the semantics (not from the spec):
    the prefix (parent), the tokens, the adapter, the salt of a first block, and the multimodal
    items overlapping the block with their position relative to it."""
    end = case.start + BLOCK
    items = tuple(
        ("item", sym.string(f"mm{j}"), off - case.start)
        for j, (off, length) in enumerate(case.mm)
        if off < end and off + length > case.start
    )
    return (
        sym.string("parent") if case.start > 0 else "first-block",
        tuple(sym.int(f"t{j}") for j in range(BLOCK)),
        (sym.string("lora_name"), sym.string("lora_path")) if case.lora else None,
        sym.string("salt") if case.salt and case.start == 0 else None,
        items,
    )


def _premises(case: Case, sym: Sym) -> list[z3.BoolRef]:
    """A salt is non-empty (vLLM keys only truthy salts)."""
    return [z3.Length(sym.string("salt")) > 0] if case.salt else []


def _same_content_same_length(ca: Case, sa: Sym, cb: Case, sb: Sym) -> list[z3.BoolRef]:
    """An identifier is a content hash: equal identifiers have equal placeholder lengths."""
    out = []
    for (i, (_, la)), (j, (_, lb)) in itertools.product(enumerate(ca.mm), enumerate(cb.mm)):
        if la != lb:
            out.append(sa.string(f"mm{i}") != sb.string(f"mm{j}"))
    return out


def check_hash_input_injective(timeout_s: float) -> Outcome:
    solver = z3.Solver()
    solver.set(timeout=max(1, int(timeout_s * 1000)))
    for ca, cb in itertools.product(cases("a"), cases("b")):
        if ca.start != cb.start:
            continue  # the parent hash fixes the position (hash chain, assumed collision-free)
        sa, sb = Sym("a"), Sym("b")
        ia, ib = hash_input(ca, sa), hash_input(cb, sb)
        solver.push()
        solver.add(*_premises(ca, sa), *_premises(cb, sb), *_same_content_same_length(ca, sa, cb, sb))
        solver.add(struct_eq(ia, ib), z3.Not(struct_eq(meaning(ca, sa), meaning(cb, sb))))
        answer = solver.check()
        if answer != z3.unsat:
            status = COUNTEREXAMPLE if answer == z3.sat else UNKNOWN
            model: dict[str, Any] = {"a": repr(ca), "b": repr(cb)}
            if answer == z3.sat:
                m = solver.model()
                for s in (sa, sb):
                    for v in s.vars.values():
                        model[str(v)] = str(m.eval(v, model_completion=True))
            solver.pop()
            return Outcome(
                status,
                "equal hash inputs imply equal block meaning",
                model,
                detail="two different blocks give the hash the same input",
            )
        solver.pop()
    return Outcome(PROVEN)


# --- make_block_key on symbolic bytes ----------------------------------------------------------

HASH_BYTES = 32  # SHA-256 digest


class SymBytes:
    """A byte string as a Z3 sequence of bytes, with the operations ``spec.types`` uses."""

    def __init__(self, seq: z3.SeqRef) -> None:
        self.seq = seq

    def __add__(self, other: SymBytes) -> SymBytes:
        return SymBytes(z3.Concat(self.seq, other.seq))

    def __getitem__(self, s: slice) -> SymBytes:
        n = z3.Length(self.seq)
        lo = 0 if s.start is None else (s.start if s.start >= 0 else n + s.start)
        hi = n if s.stop is None else (s.stop if s.stop >= 0 else n + s.stop)
        return SymBytes(z3.SubSeq(self.seq, lo, hi - lo))


class SymGroupId:
    """A group id as a 32-bit vector with ``int.to_bytes``'s big-endian layout."""

    def __init__(self, bv: z3.BitVecRef) -> None:
        self.bv = bv

    def to_bytes(self, length: int, byteorder: str) -> SymBytes:
        assert byteorder == "big" and length * 8 == self.bv.size()
        units = [z3.Unit(z3.Extract(8 * k + 7, 8 * k, self.bv)) for k in reversed(range(length))]
        return SymBytes(z3.Concat(*units) if len(units) > 1 else units[0])


def check_block_key_injective(timeout_s: float) -> Outcome:
    byte_string = z3.SeqSort(z3.BitVecSort(8))
    h1, h2 = z3.Const("hash1", byte_string), z3.Const("hash2", byte_string)
    g1, g2 = z3.BitVec("group1", 32), z3.BitVec("group2", 32)
    k1 = types.make_block_key(SymBytes(h1), SymGroupId(g1))  # type: ignore[arg-type]
    k2 = types.make_block_key(SymBytes(h2), SymGroupId(g2))  # type: ignore[arg-type]
    back = types.get_block_hash(k1)
    premises = [z3.Length(h1) == HASH_BYTES, z3.Length(h2) == HASH_BYTES]
    for goal_name, bad in (
        ("different (hash, group) give different keys", z3.And(k1.seq == k2.seq, z3.Or(h1 != h2, g1 != g2))),  # type: ignore[attr-defined]
        ("get_block_hash(make_block_key(h, g)) == h", back.seq != h1),  # type: ignore[attr-defined]
    ):
        solver = z3.Solver()
        solver.set(timeout=max(1, int(timeout_s * 1000)))
        solver.add(*premises, bad)
        answer = solver.check()
        if answer == z3.sat:
            m = solver.model()
            return Outcome(
                COUNTEREXAMPLE, goal_name, {str(v): str(m.eval(v, model_completion=True)) for v in (h1, h2, g1, g2)}
            )
        if answer == z3.unknown:
            return Outcome(UNKNOWN, goal_name, detail=solver.reason_unknown())
    return Outcome(PROVEN)


# --- weak key functions a user's manager might use ---------------------------------------------

VOCAB_BITS = 17  # token ids < 2**17 (a 128k vocabulary)
WEAK_BLOCK = 16


def polynomial_rolling_key(tokens: list[Any], base: int = 31, bits: int = 64) -> Any:
    """``sum(t_j * base**(n-1-j)) mod 2**bits`` (Horner, reduced once at the end), on Python ints
    or Z3 integers (where the reduction is linear: Z3 solves it as integer arithmetic)."""
    key: Any = 0
    for t in tokens:
        key = key * base + t
    return key % (1 << bits)


def truncated_token_key(tokens: list[Any]) -> Any:
    """``bytes(t & 0xFF for t in tokens)``: the token ids cut to one byte each."""
    if all(isinstance(t, int) for t in tokens):
        return bytes(t & 0xFF for t in tokens)
    return z3.Concat(*[z3.Extract(7, 0, t) for t in tokens])


def _collision(key_fn: Any, width: int, timeout_s: float, what: str) -> Outcome:
    """Token ids are Z3 integers (``width == 0``) or ``width``-bit vectors."""
    if width:
        a = [z3.BitVec(f"a{j}", width) for j in range(WEAK_BLOCK)]
        b = [z3.BitVec(f"b{j}", width) for j in range(WEAK_BLOCK)]
        in_vocab = [z3.ULT(t, 1 << VOCAB_BITS) for t in a + b]
    else:
        a = [z3.Int(f"a{j}") for j in range(WEAK_BLOCK)]
        b = [z3.Int(f"b{j}") for j in range(WEAK_BLOCK)]
        in_vocab = [z3.And(t >= 0, t < 1 << VOCAB_BITS) for t in a + b]
    constraints = [*in_vocab, z3.Or(*[x != y for x, y in zip(a, b)]), key_fn(a) == key_fn(b)]
    outcome = find_witness(a + b, constraints, timeout_s, what)
    if outcome.status == PROVEN:  # re-check the witness on Python ints
        ta = [int(outcome.model[f"a{j}"]) for j in range(WEAK_BLOCK)]
        tb = [int(outcome.model[f"b{j}"]) for j in range(WEAK_BLOCK)]
        ok = ta != tb and key_fn(ta) == key_fn(tb)
        if not ok:
            return Outcome(UNKNOWN, what, outcome.model, detail="witness did not replay on ints")
        return Outcome(PROVEN, model={"tokens_a": ta, "tokens_b": tb}, detail=outcome.detail)
    return outcome


def check_polynomial_key_collides(timeout_s: float) -> Outcome:
    return _collision(
        lambda ts: polynomial_rolling_key(ts),
        0,
        timeout_s,
        "two different 16-token blocks with equal polynomial rolling keys",
    )


def check_truncated_token_key_collides(timeout_s: float) -> Outcome:
    return _collision(
        lambda ts: truncated_token_key(ts),
        32,
        timeout_s,
        "two different 16-token blocks with equal one-byte-per-token keys",
    )


CLAIMS = [
    Claim(
        "keys.hash_input_injective",
        "Different (parent, tokens, LoRA, salt, multimodal items) give different inputs to the block hash.",
        (
            "pickle of str/int/None tuples is injective",
            "salts are non-empty",
            "equal multimodal identifiers have equal lengths (content hash)",
            "the parent hash fixes the block position",
        ),
        check_hash_input_injective,
        bound="blocks of 4 tokens at positions 0 and 4, every pair of 20-32 request shapes",
    ),
    Claim(
        "keys.block_key_injective",
        "make_block_key maps different (hash, group id) to different keys; get_block_hash inverts it.",
        ("block hashes are 32 bytes (SHA-256)", "0 <= group id < 2**32"),
        check_block_key_injective,
    ),
    Claim(
        "keys.polynomial_key_collides",
        "A 64-bit polynomial rolling key (base 31) over 16 token ids < 2**17 has collisions (witness).",
        ("token ids < 2**17",),
        check_polynomial_key_collides,
        bound="16-token blocks",
    ),
    Claim(
        "keys.truncated_token_key_collides",
        "A key of one byte per token id has collisions (witness).",
        ("token ids < 2**17",),
        check_truncated_token_key_collides,
        bound="16-token blocks",
    ),
]
