"""Invariants checked on an ``Observation``: the spec's own predicates, on any target's state.

There is one registry of invariants, ``spec.invariants``.  To check vLLM, ``impl`` or a user's
manager, ``state_from_observation`` rebuilds a spec state from what the target reports (tables,
cached counts, ref counts, free-queue order, keys, hash map), and the requests are the scheduler's
own (the same op stream) carrying the hashes the target computed; then every state predicate runs
on it, names included: those in force for the target's engine (``ObsContext.engine``: a vLLM-policy
invariant is not checked on SGLang, an engine-neutral one is).  Only the event replay (§9.20) is
kept here, because a target's pending events are invisible until it hands them over
(``EventLedger``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import cast

from kvspec.harness.core.observation import Observation
from kvspec.spec.block_pool import BlockPool
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.hashing import get_published_hash
from kvspec.spec.invariants import check_invariants
from kvspec.spec.request import Request
from kvspec.spec.state import GroupState, KVCacheManagerState
from kvspec.spec.types import BlockHash, BlockId, BlockKey, RequestId, get_group_id


@dataclass(frozen=True)
class ObsViolation:
    name: str
    message: str
    blocks: tuple[int, ...] = ()
    requests: tuple[str, ...] = ()


@dataclass
class ObsContext:
    """What the harness knows beyond the observation: the requests (as the scheduler built them)
    and the history so far."""

    requests: Mapping[str, Request] = field(default_factory=dict)
    evicted_ever: bool = False  # evict_blocks was called (relaxes §9.8, §9.10, §9.16)
    engine: str = "vllm"  # the target's engine: its policy invariants and the neutral ones are checked


def state_from_observation(obs: Observation, config: KVCacheConfig) -> KVCacheManagerState:
    """The spec state a target reports.  Fields a target does not report (the key token counts)
    are left unknown, and the predicates that need them skip those blocks."""
    n = len(obs.ref_cnt)
    pool = BlockPool(
        num_blocks=n,  # type: ignore[arg-type]
        enable_caching=config.enable_caching,
        profile=config.profile,
        enable_kv_cache_events=False,
        ref_cnt=obs.ref_cnt,
        block_key=tuple(None if k is None else BlockKey(k) for k in obs.block_key),
        block_key_tokens=obs.block_key_tokens if len(obs.block_key_tokens) == n else (None,) * n,
        secondary_keys={BlockId(b): tuple(sorted(BlockKey(k) for k in keys)) for b, keys in obs.secondary_keys.items()},
        free_queue=tuple(BlockId(b) for b in obs.free_queue),
        cached={BlockKey(k): tuple(BlockId(b) for b in ids) for k, ids in obs.cached.items()},
        events=(),
    )
    groups = tuple(
        GroupState(
            {RequestId(r): tuple(BlockId(b) for b in t) for r, t in tables.items()},
            {RequestId(r): c for r, c in cached.items()},
        )
        for tables, cached in zip(obs.tables, obs.num_cached_block)
    )
    return KVCacheManagerState(config, pool, groups)


def check_observation(obs: Observation, config: KVCacheConfig, ctx: ObsContext | None = None) -> list[ObsViolation]:
    """Every state invariant of ``spec.invariants`` in force for the target's engine (``ctx.engine``:
    the engine-neutral ones and that engine's policy, which reads ``obs.facts``) on the observed
    state; [] means consistent."""
    ctx = ctx or ObsContext()
    requests = {
        RequestId(rid): replace(req, block_hashes=tuple(BlockHash(h) for h in obs.request_block_hashes.get(rid, ())))
        for rid, req in ctx.requests.items()
    }
    state = state_from_observation(obs, config)
    return [
        ObsViolation(v.name, f"{v.rule}: {v.message}")
        for v in check_invariants(state, requests, evict_called=ctx.evicted_ever, engine=ctx.engine, facts=obs.facts)
    ]


class EventLedger:
    """[20] Replaying the events rebuilds the hash map: per key, stored minus removed equals the
    number of blocks the map holds under it (duplicates included); ``AllBlocksCleared`` empties it."""

    def __init__(self) -> None:
        self.count: Counter[bytes] = Counter()

    def feed(self, events: list[dict[str, object]]) -> None:
        for e in events:
            t = e.get("type")
            if t == "AllBlocksCleared":
                self.count.clear()
                continue
            gid = int(e["group_id"]).to_bytes(4, "big")  # type: ignore[call-overload]
            for h in cast(Iterable[object], e["block_hashes"]):
                key = bytes.fromhex(str(h)) + gid
                self.count[key] += 1 if t == "BlockStored" else -1

    def check(self, obs: Observation) -> list[ObsViolation]:
        """Events name a key by the request hash it ends with (``spec.hashing.get_published_hash``:
        the key's hash, or the last fine hash of a concatenated key before vLLM 0.24)."""
        out = []
        held: dict[bytes, tuple[int, ...]] = {}
        for key, blocks in obs.cached.items():
            held[get_published_hash(BlockHash(key[:-4])) + key[-4:]] = tuple(blocks)
        keys = set(self.count) | set(held)
        for key in sorted(keys):
            want = len(held.get(key, ()))
            got = self.count.get(key, 0)
            if want != got:
                out.append(
                    ObsViolation(
                        "events_replay",
                        f"events say key {key[:-4].hex()[:12]}/g{get_group_id(BlockKey(key))} is stored {got} time(s), "
                        f"the map holds {want} block(s)",
                        held.get(key, ()),
                    )
                )
        return out
