"""The forms a target's outcomes and observations must have, checked where they enter the harness.

``harness.targets.base`` documents one JSON form per operation (``FORMS`` below) and the
``Observation`` fields (``harness.core.observation``).  ``Lockstep`` checks every value a target hands
back against them right after the call returns, so a target that returns the wrong thing is a
``target-malformed`` finding naming the step, the operation, the form and what came back, never a
crash deeper in the harness (the comparison, the invariants, the scheduler model).

Each check returns None when the value has the form, else a ``Malformed``: where in the value the
problem is, what was expected there, and a truncated ``repr`` of what came back.  Types are exact
(``bool`` is not an int, a tuple is not a JSON list), group counts and block-id ranges follow the
config (subclasses of the documented types are accepted, ``bool`` excepted).

Cost (every step of every fuzz run goes through here): element types are checked container by
container in C (``set(map(type, xs))``), never entry by entry in Python.  An observation first goes
through ``plainly_well_formed``, one pass with exact types only (about 60% of what building the
observation costs, a few microseconds on the fuzzer's small pools); only when that says no does
``check_observation`` walk the fields to decide and to say where.  Everything is deep-checked on
every step, no sampling: the pools are small, and an unchecked entry is a crash waiting downstream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, NoReturn, cast

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation

REPR_LIMIT = 200

FORMS: dict[type, str] = {
    O.GetComputedBlocks: '{"block_ids": [[int, ...] per group], "num_hit_tokens": int}',
    O.AllocateSlots: 'None (out of blocks) or {"block_ids": [[int, ...] per group]}',
    O.ResetPrefixCache: "a bool",
    O.TakeEvents: "a list of events in event_to_json form",
}
NONE_FORM = "None"
OBSERVATION_FORM = "an Observation (harness/core/observation.py) with one table per group and one entry per block"

EVENT_KEYS = {  # the fields of each event type (also the trace's JSON Schema: harness.traces.json_schema)
    "BlockStored": frozenset({"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "group_id"}),
    "BlockRemoved": frozenset({"type", "block_hashes", "group_id"}),
    "AllBlocksCleared": frozenset({"type"}),
}


def short_repr(value: Any, limit: int = REPR_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters (a malformed value may be huge)."""
    try:
        text = repr(value)
    except Exception as e:  # a target's own object with a broken __repr__
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Malformed:
    """Where a value departs from its form, what was expected there, and what came back."""

    where: str
    expected: str
    got: str

    def sentence(self) -> str:
        return f"{self.where}: expected {self.expected}, got {self.got}"


class _Bad(Exception):
    """Raised inside the checks at the first departure; turned into a ``Malformed``."""

    def __init__(self, where: str, expected: str, value: Any) -> None:
        super().__init__(where)
        self.malformed = Malformed(where, expected, short_repr(value))


def _bad(where: str, expected: str, value: Any) -> NoReturn:
    raise _Bad(where, expected, value)


def form_of(op: O.Op) -> str:
    """The documented outcome form of ``op`` (``harness/targets/base.py``)."""
    return FORMS.get(type(op), NONE_FORM)


# --- element checks -------------------------------------------------------------------------------

INT: tuple[type, ...] = (int,)
BYTES: tuple[type, ...] = (bytes,)
STR: tuple[type, ...] = (str,)
_NONE = type(None)


def _types_ok(types: set[type], allowed: tuple[type, ...]) -> bool:
    """Every type in ``types`` is (a subclass of) one of ``allowed``; ``bool`` never passes for ``int``."""
    return types.issubset(allowed) or all(t in allowed or (t is not bool and issubclass(t, allowed)) for t in types)


def _what(allowed: tuple[type, ...]) -> str:
    names = ["None" if t is _NONE else t.__name__ for t in allowed]
    return " or ".join(n if n == "None" else f"an {n}" if n[0] in "aeiou" else f"a {n}" for n in names)


def _elements(xs: Iterable[Any], where: str, allowed: tuple[type, ...], hi: int | None = None) -> None:
    """Every element of ``xs`` of an ``allowed`` type (checked in C, ``set(map(type, xs))``); ints
    within ``[0, hi)`` when ``hi`` is given.  Only on a departure are the elements walked one by one."""
    types = set(map(type, xs))
    if not _types_ok(types, allowed):
        i, x = next((i, x) for i, x in enumerate(xs) if not _types_ok({type(x)}, allowed))
        _bad(_at(xs, where, i, x), _what(allowed), x)
    if hi is not None and types and (min(xs) < 0 or max(xs) >= hi):
        i, x = next((i, x) for i, x in enumerate(xs) if not 0 <= x < hi)
        _bad(_at(xs, where, i, x), f"a block id in [0, {hi})", x)


def _at(xs: Iterable[Any], where: str, i: int, x: Any) -> str:
    """Where element ``i`` (``x``) of ``xs`` is: an index into a sequence, else the element itself."""
    return f"{where}[{i}]" if isinstance(xs, (list, tuple)) else f"{where} ({short_repr(x, 40)})"


def _container(value: Any, kind: type, where: str, what: str, length: int | None = None) -> None:
    if not isinstance(value, kind):
        _bad(where, what, value)
    if length is not None and (size := len(cast(Sized, value))) != length:
        _bad(where, f"{what} (length {length}, not {size})", value)


def _mapping(
    d: Any,
    where: str,
    keys: tuple[type, ...],
    kind: type,
    elements: tuple[type, ...],
    hi: int | None = None,
    key_hi: int | None = None,
) -> None:
    """A dict from ``keys`` to containers of type ``kind`` holding ``elements`` (block ids in
    ``[0, hi)`` when ``hi`` is given): all values checked at once, one by one only on a departure."""
    _container(d, dict, where, f"a dict of {kind.__name__}s")
    if not d:
        return
    _elements(d.keys(), f"{where} key", keys, key_hi)
    if not _types_ok(set(map(type, d.values())), (kind,)):
        k, v = next((k, v) for k, v in d.items() if not isinstance(v, kind))
        _bad(f"{where}[{short_repr(k, 40)}]", f"a {kind.__name__}", v)
    flat = list(chain.from_iterable(d.values()))
    if not _types_ok(set(map(type, flat)), elements) or (
        hi is not None and flat and (min(flat) < 0 or max(flat) >= hi)
    ):
        for k, v in d.items():
            _elements(v, f"{where}[{short_repr(k, 40)}]", elements, hi)


def _int(x: Any, where: str, lo: int = 0, hi: int | None = None) -> None:
    """One int (not a bool) of an outcome, ``>= lo`` and ``< hi`` when given."""
    if not _types_ok({type(x)}, INT):
        _bad(where, "an int", x)
    if x < lo or (hi is not None and x >= hi):
        _bad(where, f"an int in [{lo}, {hi})" if hi is not None else f"an int >= {lo}", x)


def _block_lists(value: Any, where: str, num_groups: int, num_blocks: int) -> None:
    """``[[int, ...] per group]``: a JSON list of one list of block ids per group."""
    _container(value, list, where, "a list of block-id lists, one per group", num_groups)
    for g, ids in enumerate(value):
        _container(ids, list, f"{where}[{g}]", "a list of block ids")
        _elements(ids, f"{where}[{g}]", INT, num_blocks)


def _keys(value: dict[Any, Any], where: str, keys: frozenset[str]) -> None:
    if value.keys() != keys:
        missing, extra = sorted(keys - value.keys()), sorted(map(str, value.keys() - keys))
        detail = "; ".join(x for x in (f"missing {missing}" if missing else "", f"extra {extra}" if extra else "") if x)
        _bad(where, f"exactly the keys {sorted(keys)} ({detail})", value)


def _hex(value: Any, where: str) -> None:
    if type(value) is not str:
        _bad(where, "a hex string", value)
    try:
        bytes.fromhex(value)
    except ValueError:
        _bad(where, "a hex string", value)


# --- outcomes -------------------------------------------------------------------------------------


def check_computed_blocks(out: Any, num_groups: int, num_blocks: int) -> None:
    """``GetComputedBlocks``: ``{"block_ids": [[int, ...] per group], "num_hit_tokens": int}``."""
    _container(out, dict, "outcome", "a dict")
    _keys(out, "outcome", frozenset({"block_ids", "num_hit_tokens"}))
    _block_lists(out["block_ids"], "outcome.block_ids", num_groups, num_blocks)
    _int(out["num_hit_tokens"], "outcome.num_hit_tokens")


def check_allocate_slots(out: Any, num_groups: int, num_blocks: int) -> None:
    """``AllocateSlots``: ``None`` (out of blocks) or ``{"block_ids": [[int, ...] per group]}``."""
    if out is None:
        return
    _container(out, dict, "outcome", "None or a dict")
    _keys(out, "outcome", frozenset({"block_ids"}))
    _block_lists(out["block_ids"], "outcome.block_ids", num_groups, num_blocks)


def check_reset_prefix_cache(out: Any, num_groups: int, num_blocks: int) -> None:
    """``ResetPrefixCache``: a bool."""
    if type(out) is not bool:
        _bad("outcome", "a bool", out)


def check_take_events(out: Any, num_groups: int, num_blocks: int) -> None:
    """``TakeEvents``: a list of ``event_to_json`` dicts (``harness.core.observation``)."""
    _container(out, list, "outcome", "a list of events")
    for i, e in enumerate(out):
        where = f"outcome[{i}]"
        _container(e, dict, where, "an event dict")
        kind = e.get("type")
        keys = EVENT_KEYS.get(kind) if type(kind) is str else None
        if keys is None:
            _bad(f"{where}.type", f"one of {sorted(EVENT_KEYS)}", e.get("type"))
        _keys(e, where, keys)
        if "group_id" in keys:
            _int(e["group_id"], f"{where}.group_id", 0, num_groups)
        if "block_hashes" in keys:
            _container(e["block_hashes"], list, f"{where}.block_hashes", "a list of hex strings")
            for j, h in enumerate(e["block_hashes"]):
                _hex(h, f"{where}.block_hashes[{j}]")
        if "token_ids" in keys:
            if e["parent_block_hash"] is not None:
                _hex(e["parent_block_hash"], f"{where}.parent_block_hash")
            _container(e["token_ids"], list, f"{where}.token_ids", "a list of ints")
            _elements(e["token_ids"], f"{where}.token_ids", INT)
            _int(e["block_size"], f"{where}.block_size", 1)


def check_none(out: Any, num_groups: int, num_blocks: int) -> None:
    """Every other operation: None."""
    if out is not None:
        _bad("outcome", "None (the operation has no outcome)", out)


_OUTCOME_CHECKS: dict[type, Callable[[Any, int, int], None]] = {
    O.GetComputedBlocks: check_computed_blocks,
    O.AllocateSlots: check_allocate_slots,
    O.ResetPrefixCache: check_reset_prefix_cache,
    O.TakeEvents: check_take_events,
}


def outcome_problem(op: O.Op, out: Any, num_groups: int, num_blocks: int) -> Malformed | None:
    """None if ``out`` has the documented form of ``op``'s outcome, else where and how it departs."""
    try:
        _OUTCOME_CHECKS.get(type(op), check_none)(out, num_groups, num_blocks)
    except _Bad as e:
        return e.malformed
    return None


# --- observations ---------------------------------------------------------------------------------


def _counts(d: Any, where: str) -> None:
    """``num_cached_block`` of one group: a dict request id -> int >= 0."""
    _container(d, dict, where, "a dict str -> int")
    _elements(d.keys(), f"{where} key", STR)
    values = list(d.values())
    if values and (not _types_ok(set(map(type, values)), INT) or min(values) < 0):
        k, v = next((k, v) for k, v in d.items() if not _types_ok({type(v)}, INT) or v < 0)
        _bad(f"{where}[{k!r}]", "an int >= 0", v)


def check_observation(obs: Any, num_groups: int, num_blocks: int) -> None:
    """``observe()``: an ``Observation`` whose fields have the documented types and sizes."""
    if not isinstance(obs, Observation):
        _bad("observe()", "an Observation", obs)
    obs = _plain(obs)
    n = num_blocks
    for name in ("tables", "num_cached_block"):
        _container(getattr(obs, name), tuple, name, "a tuple of dicts, one per group", num_groups)
    for g, table in enumerate(obs.tables):
        _mapping(table, f"tables[{g}]", STR, tuple, INT, n)
    for g, counts in enumerate(obs.num_cached_block):
        _counts(counts, f"num_cached_block[{g}]")
    _container(obs.ref_cnt, tuple, "ref_cnt", "a tuple of ints, one per block", n)
    _elements(obs.ref_cnt, "ref_cnt", INT)
    _container(obs.free_queue, tuple, "free_queue", "a tuple of block ids")
    _elements(obs.free_queue, "free_queue", INT, n)
    _container(obs.block_key, tuple, "block_key", "a tuple of bytes or None, one per block", n)
    _elements(obs.block_key, "block_key", (bytes, _NONE))
    if not (isinstance(obs.block_key_tokens, tuple) and len(obs.block_key_tokens) == 0):  # () = not reported
        _container(obs.block_key_tokens, tuple, "block_key_tokens", "a tuple of int or None, one per block (or ())", n)
        _elements(obs.block_key_tokens, "block_key_tokens", (int, _NONE))
    _mapping(obs.cached, "cached", BYTES, tuple, INT, n)
    _mapping(obs.request_block_hashes, "request_block_hashes", STR, tuple, BYTES)
    _mapping(obs.secondary_keys, "secondary_keys", INT, frozenset, BYTES, key_hi=n)


def _plain(obs: Observation) -> Observation:
    """The spec's own persistent containers (``spec.persistent``, ``spec.linked_queue``: large pools) read as the tuples
    and dicts they stand for; any other value is checked as it is."""
    from kvspec.spec.linked_queue import LinkedQueue
    from kvspec.spec.persistent import PMap, PVec

    seq = (PVec, LinkedQueue)
    fields: dict[str, Any] = {
        name: tuple(value)
        for name in ("ref_cnt", "free_queue", "block_key", "block_key_tokens")
        if isinstance(value := getattr(obs, name), seq)
    }
    if isinstance(obs.cached, PMap):
        fields["cached"] = obs.cached.to_dict()
    return replace(obs, **fields) if fields else obs


_EXACT = {t: frozenset({t}) for t in (int, bytes, str, tuple, frozenset)}
_INT_OR_NONE, _BYTES_OR_NONE = frozenset({int, _NONE}), frozenset({bytes, _NONE})


def plainly_well_formed(obs: Any, num_groups: int, num_blocks: int) -> bool:
    """The common case at C speed: True when every field has exactly the documented type (no
    subclasses), size and range; False means "look closer" (``check_observation`` decides and says
    where).  One pass of ``set(map(type, ...))`` per container, no per-entry Python code."""
    if type(obs) is not Observation:
        return False
    ids = _plain_tables(obs, num_groups)
    return (
        ids is not None
        and _plain_block_ids(obs, ids, num_blocks)
        and _plain_hashes(obs, num_blocks)
        and _plain_per_block(obs, num_blocks)
    )


def _plain_dict(d: Any, keys: frozenset[type], values: frozenset[type]) -> bool:
    """``d`` is exactly a dict whose keys' and values' types are among ``keys`` and ``values``."""
    return type(d) is dict and set(map(type, d)) <= keys and set(map(type, d.values())) <= values


def _plain_tables(obs: Observation, num_groups: int) -> list[Any] | None:
    """The block ids of the tables, when the tables and cached counts are plainly formed; else None."""
    tables, counts = obs.tables, obs.num_cached_block
    if type(tables) is not tuple or type(counts) is not tuple or len(tables) != num_groups or len(counts) != num_groups:
        return None
    ids: list[Any] = []
    for table in tables:
        if not _plain_dict(table, _EXACT[str], _EXACT[tuple]):
            return None
        ids += chain.from_iterable(table.values())
    for c in counts:
        if not _plain_dict(c, _EXACT[str], _EXACT[int]) or (c and min(c.values()) < 0):
            return None
    return ids


def _plain_block_ids(obs: Observation, ids: list[Any], n: int) -> bool:
    """The cached map and the free queue plainly formed, and every block id (tables' included) in range."""
    if not _plain_dict(obs.cached, _EXACT[bytes], _EXACT[tuple]) or type(obs.free_queue) is not tuple:
        return False
    ids += chain.from_iterable(obs.cached.values())
    ids += obs.free_queue
    return set(map(type, ids)) <= _EXACT[int] and not (ids and (min(ids) < 0 or max(ids) >= n))


def _plain_hashes(obs: Observation, n: int) -> bool:
    """The requests' block hashes and the secondary keys plainly formed (keys' blocks in range)."""
    hashes, secondary = obs.request_block_hashes, obs.secondary_keys
    if not _plain_dict(hashes, _EXACT[str], _EXACT[tuple]):
        return False
    if not set(map(type, chain.from_iterable(hashes.values()))) <= _EXACT[bytes]:
        return False
    if not _plain_dict(secondary, _EXACT[int], _EXACT[frozenset]) or (
        secondary and (min(secondary) < 0 or max(secondary) >= n)
    ):
        return False
    return set(map(type, chain.from_iterable(secondary.values()))) <= _EXACT[bytes]


def _plain_per_block(obs: Observation, n: int) -> bool:
    """The per-block tuples (reference counts, keys, key tokens) plainly formed, one entry per block."""
    ref_cnt, keys, key_tokens = obs.ref_cnt, obs.block_key, obs.block_key_tokens
    if type(ref_cnt) is not tuple or len(ref_cnt) != n or not set(map(type, ref_cnt)) <= _EXACT[int]:
        return False
    if type(keys) is not tuple or len(keys) != n or not set(map(type, keys)) <= _BYTES_OR_NONE:
        return False
    return type(key_tokens) is tuple and (
        not key_tokens or (len(key_tokens) == n and set(map(type, key_tokens)) <= _INT_OR_NONE)
    )


def observation_problem(obs: Any, num_groups: int, num_blocks: int) -> Malformed | None:
    """None if ``obs`` is a well-formed ``Observation`` for the config, else where and how it departs."""
    if plainly_well_formed(obs, num_groups, num_blocks):
        return None
    try:
        check_observation(obs, num_groups, num_blocks)
    except _Bad as e:
        return e.malformed
    return None
