"""What the state predicates remember between checks, so that a run costs what changed.

The predicates of ``spec.invariants.state_invariants`` are pure functions of one state.  Two of them
would redo, at every check, work that grows with the run: ``hash_chain`` rehashing every request's
tokens, and ``events_rebuild_hash_map`` replaying every event taken so far.  Both results are kept
here, keyed so that a changed input is never answered from an old result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import Request, recompute_block_hashes
from kvspec.spec.types import BlockHash, BlockKey, make_block_key

_HASH_MEMO: dict[tuple[Any, ...], tuple[BlockHash, ...]] = {}
_LAST: dict[str, tuple[Request, Profile, tuple[BlockHash, ...]]] = {}  # request id -> its last recomputation


def recompute_hashes(req: Request, profile: Profile) -> tuple[BlockHash, ...]:
    """``recompute_block_hashes``, memoised: a request is a value, so the same object (checked after
    every step while nothing changes it) is recomputed once, equal contents share one
    recomputation, and a request that grew extends the recomputation of its last version (only its
    new blocks are hashed)."""
    last = _LAST.get(req.request_id)
    if last is not None and last[0] is req and last[1] is profile:
        return last[2]
    memo_key = (req.prompt_token_ids, req.all_token_ids, req.features, req.hash_block_size, req.hash_algo, profile)
    hashes = _HASH_MEMO.get(memo_key)
    if hashes is None:
        if len(_HASH_MEMO) > 4096:
            _HASH_MEMO.clear()
        known = (last[0], last[2]) if last is not None and last[1] is profile else None
        hashes = _HASH_MEMO[memo_key] = recompute_block_hashes(req, profile, known)
    if len(_LAST) > 4096:
        _LAST.clear()
    _LAST[req.request_id] = (req, profile, hashes)
    return hashes


def replay(events: Iterable[Event], counts: Counter[BlockKey]) -> Counter[BlockKey]:
    """``counts`` moved by ``events``: each key stored +1, removed -1, a clear empties all."""
    for e in events:
        if isinstance(e, AllBlocksCleared):
            counts.clear()
        elif isinstance(e, BlockStored):
            for h in e.block_hashes:
                counts[make_block_key(h, e.group_id)] += 1
        elif isinstance(e, BlockRemoved):
            for h in e.block_hashes:
                counts[make_block_key(h, e.group_id)] -= 1
    return counts


_TAKEN: dict[int, tuple[Sequence[Event], int, Event | None, Counter[BlockKey]]] = {}


def taken_counts(log: Sequence[Event]) -> Counter[BlockKey]:
    """The replay of a log of taken events, memoised by the log's identity: a log that only grew
    since (same object, its last replayed event still in place) replays only its new events.
    Callers append to their log (``harness.check.lockstep``), so a run costs O(events), not
    O(events squared)."""
    memo = _TAKEN.get(id(log))
    if memo is not None and memo[0] is log and len(log) >= memo[1] and (memo[1] == 0 or log[memo[1] - 1] is memo[2]):
        counts = replay(log[memo[1] :], memo[3])
    else:
        counts = replay(log, Counter())
    if len(_TAKEN) > 64:
        _TAKEN.clear()
    _TAKEN[id(log)] = (log, len(log), log[-1] if log else None, counts)  # holds log: its id is not reused meanwhile
    return counts
