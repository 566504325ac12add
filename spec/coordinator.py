"""Coordinators: how the groups of one model share the pool and agree on a prefix hit.

Models vLLM 0.33.0 ``vllm/v1/core/kv_cache_coordinator.py``: ``KVCacheCoordinatorNoPrefixCache``
(caching off), ``UnitaryKVCacheCoordinator`` (one group) and ``HybridKVCacheCoordinator`` (several
groups, hits aligned to the LCM of the block sizes, found by a fixed-point search).  Which one
applies follows from the config (``get_coordinator_kind``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from kvspec.spec import arith, managers
from kvspec.spec.config import AttentionSpec, KVCacheConfig
from kvspec.spec.releases.profile import ExternalAllocation, HybridHitTrim
from kvspec.spec.request import Request
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import BlockHash, BlockId, GroupBlockIds, GroupId, RequestId

CoordinatorKind = Literal["no_prefix_cache", "unitary", "hybrid"]


def get_coordinator_kind(config: KVCacheConfig) -> CoordinatorKind:
    """vLLM 0.33 ``get_kv_cache_coordinator``."""
    if not config.enable_caching:
        return "no_prefix_cache"
    return "unitary" if len(config.groups) == 1 else "hybrid"


def get_hit_alignment(config: KVCacheConfig) -> int:
    """Hit lengths are multiples of this: the block size for one group, the LCM for a hybrid
    (vLLM 0.33 ``cache_hit_alignment_tokens``, which is ``scheduler_block_size`` either way)."""
    return config.scheduler_block_size


@dataclass(frozen=True, slots=True)
class SpecGroup:
    """vLLM 0.33 ``SpecGroup``: groups with an equal spec are looked up jointly."""

    spec: AttentionSpec
    group_ids: tuple[GroupId, ...]


def get_spec_groups(config: KVCacheConfig) -> tuple[SpecGroup, ...]:
    """vLLM 0.33 ``verify_and_split_kv_cache_groups``: merge equal specs (cacheable groups only),
    full attention first, otherwise in first-appearance order (a stable sort)."""
    merged: dict[tuple[object, ...], list[GroupId]] = {}
    specs: dict[tuple[object, ...], AttentionSpec] = {}
    for gid, spec in enumerate(config.groups):
        if not spec.is_prefix_cacheable:
            continue
        merged.setdefault(spec.manager_key, []).append(GroupId(gid))
        specs.setdefault(spec.manager_key, spec)
    groups = [SpecGroup(specs[k], tuple(ids)) for k, ids in merged.items()]
    return tuple(sorted(groups, key=lambda g: g.spec.kind != "full"))


SearchFn = Callable[[SpecGroup, int], tuple[GroupBlockIds, int]]


def find_longest_cache_hit_hybrid(
    spec_groups: Sequence[SpecGroup],
    num_groups: int,
    max_cache_hit_length: int,
    search: SearchFn,
    trim: HybridHitTrim = "every_full_group",
) -> tuple[GroupBlockIds, int, int]:
    """vLLM 0.33 ``HybridKVCacheCoordinator.find_longest_cache_hit``: a fixed point.

    Start from the cap; each spec group either accepts the candidate length or lowers it (its own
    search with that length as the maximum).  Full attention is searched once (its hits are
    downward closed) and afterwards only clamps; any other kind is searched again at every
    candidate, because a sliding-window hit is not monotone in the length.  Repeat until a round
    leaves the length unchanged; with exactly one full-attention and one other spec group, one
    reduction suffices.  Full-attention lists are then cut to the final length (``trim``:
    ``get_trimmed_spec_groups``).  Returns the per-group hits, the length, and how much longer the
    longest single-group hit was.
    """
    hit_length = max_cache_hit_length
    longest = 0
    hits: list[tuple[BlockId, ...] | None] = [None] * num_groups
    lengths = [0] * num_groups
    is_simple = len(spec_groups) == 2 and spec_groups[0].spec.kind == "full"
    while True:
        current = hit_length
        for sg in spec_groups:
            first = sg.group_ids[0]
            if sg.spec.kind == "full" and hits[first] is not None:
                current = min(current, lengths[first])
                continue
            found, current = search(sg, current)
            for gid, blocks in zip(sg.group_ids, found):
                hits[gid] = blocks
                lengths[gid] = current
            longest = max(longest, current)
        if current >= hit_length:
            break
        hit_length = current
        if is_simple:
            break
    for sg in get_trimmed_spec_groups(spec_groups, trim):
        num_blocks = arith.cdiv(hit_length, sg.spec.block_size)
        for gid in sg.group_ids:
            kept = hits[gid]
            if kept is not None:
                hits[gid] = kept[:num_blocks]
    return tuple(h if h is not None else () for h in hits), hit_length, longest - hit_length


def get_trimmed_spec_groups(spec_groups: Sequence[SpecGroup], trim: HybridHitTrim) -> Sequence[SpecGroup]:
    """The full-attention spec groups a hybrid lookup cuts to the final hit length: every one from
    vLLM 0.29 on; before (``Profile.hybrid_hit_trim == "first_group"``, Change
    ``hybrid_lookup_truncates_every_full_attention_group``) only the first spec group, when it is
    full attention, so a second full-attention spec group keeps the blocks of its first search."""
    if trim == "first_group":
        return spec_groups[:1] if spec_groups and spec_groups[0].spec.kind == "full" else ()
    return [sg for sg in spec_groups if sg.spec.kind == "full"]


def find_longest_cache_hit(
    state: KVCacheManagerState, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
) -> tuple[GroupBlockIds, int, int]:
    """The coordinator's lookup: per-group hit blocks, hit length, uncached common prefix."""
    config = state.config
    num_groups = len(config.groups)
    kind = get_coordinator_kind(config)
    if kind == "no_prefix_cache":
        return tuple(() for _ in range(num_groups)), 0, 0
    alignment = get_hit_alignment(config)

    def search(sg: SpecGroup, max_length: int) -> tuple[GroupBlockIds, int]:
        return managers.find_longest_cache_hit(state, sg.spec, sg.group_ids, block_hashes, max_length, alignment)

    if kind == "unitary":
        found, length = search(SpecGroup(config.groups[0], (GroupId(0),)), max_cache_hit_length)
        return found, length, 0
    return find_longest_cache_hit_hybrid(
        get_spec_groups(config), num_groups, max_cache_hit_length, search, config.profile.hybrid_hit_trim
    )


def get_num_blocks_to_allocate(
    state: KVCacheManagerState,
    request_id: RequestId,
    num_tokens: int,
    new_computed_blocks: GroupBlockIds,
    num_encoder_tokens: int,
    total_computed_tokens: int,
    apply_admission_cap: bool = False,
) -> int:
    """vLLM 0.33 ``KVCacheCoordinator.get_num_blocks_to_allocate``: the sum over groups; a
    cross-attention group is asked for the encoder tokens, with no hits and nothing computed."""
    total = 0
    for gid, spec in enumerate(state.config.groups):
        g = GroupId(gid)
        if spec.kind == "cross":
            total += managers.get_num_blocks_to_allocate(
                state, g, request_id, num_encoder_tokens, (), 0, apply_admission_cap
            )
        else:
            hits = new_computed_blocks[gid] if new_computed_blocks else ()
            total += managers.get_num_blocks_to_allocate(
                state, g, request_id, num_tokens, hits, total_computed_tokens, apply_admission_cap
            )
    return total


def allocate_new_computed_blocks(
    state: KVCacheManagerState,
    request_id: RequestId,
    new_computed_blocks: GroupBlockIds,
    num_local_computed_tokens: int,
    num_external_computed_tokens: int,
) -> KVCacheManagerState:
    """vLLM 0.33 ``allocate_new_computed_blocks``, two-phase (fix of vLLM issue #33775): touch
    every group's hits first, then allocate external blocks for every group, so that one group's
    fresh blocks cannot evict another group's not-yet-touched hit.  A no-op for a request already
    admitted by any group."""
    groups = range(len(state.config.groups))
    if any(request_id in state.groups[gid].num_cached_block for gid in groups):
        assert all(not hits for hits in new_computed_blocks), "a running request cannot adopt new prefix hits"
        return state
    for phase in get_adoption_phases(len(state.config.groups), state.config.profile.external_allocation):
        for gid in phase:
            hits = new_computed_blocks[gid] if new_computed_blocks else ()
            state = managers.add_local_computed_blocks(
                state, GroupId(gid), request_id, hits, num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for gid in phase:
                state = managers.allocate_external_computed_blocks(
                    state, GroupId(gid), request_id, num_local_computed_tokens, num_external_computed_tokens
                )
    return state


def get_adoption_phases(num_groups: int, rule: ExternalAllocation) -> tuple[range, ...]:
    """The groups that adopt their hits before any of them allocates external blocks: all of them
    at once from vLLM 0.24 on; in 0.23 (``Profile.external_allocation == "per_group"``, Change
    ``two_phase_external_allocation``) one group at a time, so a group's fresh external blocks can
    be a later group's hit not yet touched."""
    if rule == "per_group":
        return tuple(range(g, g + 1) for g in range(num_groups))
    return (range(num_groups),)


def allocate_new_blocks(
    state: KVCacheManagerState, request_id: RequestId, num_tokens: int, num_encoder_tokens: int
) -> tuple[KVCacheManagerState, GroupBlockIds]:
    """vLLM 0.33 ``allocate_new_blocks``, group by group (cross-attention sized by the encoder)."""
    fresh: list[tuple[BlockId, ...]] = []
    for gid, spec in enumerate(state.config.groups):
        n = num_encoder_tokens if spec.kind == "cross" else num_tokens
        state, new = managers.allocate_new_blocks(state, GroupId(gid), request_id, n)
        fresh.append(new)
    return state, tuple(fresh)


def get_num_cacheable_tokens(config: KVCacheConfig, num_computed_tokens: int) -> int:
    """vLLM 0.33 ``get_num_cacheable_tokens``: a hybrid caches only up to an LCM boundary (a hit
    can never end elsewhere); one group caches everything computed."""
    if get_coordinator_kind(config) == "hybrid":
        return arith.align_down(num_computed_tokens, config.scheduler_block_size)
    return max(0, num_computed_tokens)


def cache_blocks(state: KVCacheManagerState, request: Request, num_computed_tokens: int) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheCoordinator.cache_blocks``: every group, when caching is on."""
    if not state.config.enable_caching:
        return state
    n = get_num_cacheable_tokens(state.config, num_computed_tokens)
    alignment = get_hit_alignment(state.config)
    for gid in range(len(state.config.groups)):
        state = managers.cache_blocks(state, GroupId(gid), request, n, alignment)
    return state


def free(state: KVCacheManagerState, request_id: RequestId) -> KVCacheManagerState:
    """vLLM 0.33 ``KVCacheCoordinator.free``: each group frees its own table, in group order."""
    for gid in range(len(state.config.groups)):
        state = managers.free(state, GroupId(gid), request_id)
    return state


def remove_skipped_blocks(
    state: KVCacheManagerState, request_id: RequestId, num_computed_tokens: int
) -> KVCacheManagerState:
    for gid in range(len(state.config.groups)):
        state = managers.remove_skipped_blocks(state, GroupId(gid), request_id, num_computed_tokens)
    return state
