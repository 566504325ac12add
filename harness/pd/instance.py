"""One engine's manager calls, and the KV contents of its blocks.

Every call goes to ``spec.kv_cache_manager`` (the state is a value) and is logged as the
``harness.core.ops`` operation a real scheduler's call corresponds to, with its outcome in the JSON form
of ``harness.targets.base``: the harness replays the log on a real vLLM 0.33 ``KVCacheManager``
and requires the same outcomes.  ``memory`` is the ground truth of the data plane: what each block
holds (the token prefix its KV belongs to, and which layers of it are there); a fresh block holds
garbage (``None``) until something is computed or transferred into it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.pd.messages import Content
from kvspec.harness.pd.state import InstanceState
from kvspec.harness.pd.types import InstanceId
from kvspec.spec import kv_cache_manager as kvm
from kvspec.spec import request as rq
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.kv_cache_manager import ComputedBlocks
from kvspec.spec.request import RequestStatus
from kvspec.spec.types import BlockId, GroupId, RequestId

RESET = "reset"
"""A log entry (not a manager call): the instance restarted with a fresh manager."""


def init_instance(name: InstanceId, config: KVCacheConfig) -> InstanceState:
    """A fresh engine: vLLM 0.33 ``KVCacheManager.__init__`` (block 0 null, everything free)."""
    return InstanceState(name, config, kvm.init_kv_cache_manager(config), {}, {}, {}, ((RESET, None),))


def get_block_size(inst: InstanceState) -> int:
    return int(inst.config.groups[0].block_size)


def get_table(inst: InstanceState, rid: RequestId) -> tuple[BlockId, ...]:
    return inst.manager.groups[0].req_to_blocks.get(rid, ())


def holds_blocks(inst: InstanceState, rid: RequestId) -> bool:
    return rid in inst.manager.groups[0].req_to_blocks


def get_request(inst: InstanceState, rid: RequestId) -> rq.Request:
    return inst.requests[rid]


def _log(inst: InstanceState, op: Any, outcome: Any) -> InstanceState:
    return replace(inst, log=inst.log + ((op, outcome),))


def _with_request(inst: InstanceState, req: rq.Request, op: Any) -> InstanceState:
    requests = dict(inst.requests)
    requests[req.request_id] = req
    return _log(replace(inst, requests=requests), op, None)


# --- the scheduler's changes to its Request ------------------------------------------------------


def ensure_request(inst: InstanceState, rid: RequestId, prompt: tuple[int, ...]) -> InstanceState:
    """A new request (vLLM ``Request(...)``), or an old one made admissible again (computed count
    0, WAITING: how vLLM re-admits a preempted or freed request)."""
    if rid not in inst.requests:
        return _with_request(inst, rq.make_request(rid, prompt, inst.config), O.AddRequest(rid, prompt))
    assert not holds_blocks(inst, rid), f"{rid} is re-admitted while it still holds blocks on {inst.name}"
    inst = set_num_computed(inst, rid, 0)
    return set_status(inst, rid, RequestStatus.WAITING)


def set_status(inst: InstanceState, rid: RequestId, status: RequestStatus) -> InstanceState:
    req = rq.with_status(inst.requests[rid], status)
    return _with_request(inst, req, O.SetStatus(rid, status.value))


def set_num_computed(inst: InstanceState, rid: RequestId, n: int) -> InstanceState:
    req = rq.with_num_computed_tokens(inst.requests[rid], n)
    return _with_request(inst, req, O.SetNumComputedTokens(rid, n))


def append_token(inst: InstanceState, rid: RequestId, token: int) -> InstanceState:
    req = rq.append_output_token_ids(inst.requests[rid], (token,))
    return _with_request(inst, req, O.AppendOutputTokens(rid, (token,)))


# --- manager calls ------------------------------------------------------------------------------


def lookup(inst: InstanceState, rid: RequestId) -> tuple[InstanceState, ComputedBlocks]:
    """vLLM 0.33 ``get_computed_blocks`` (pure)."""
    hit = kvm.get_computed_blocks(inst.manager, inst.requests[rid])
    outcome = {"block_ids": [list(g) for g in hit.blocks], "num_hit_tokens": int(hit.num_hit_tokens)}
    return _log(inst, O.GetComputedBlocks(rid), outcome), hit


def allocate(
    inst: InstanceState,
    rid: RequestId,
    num_new_tokens: int,
    hit: ComputedBlocks | None = None,
    num_external_tokens: int = 0,
    delay_cache_blocks: bool = False,
) -> tuple[InstanceState, tuple[BlockId, ...] | None]:
    """vLLM 0.33 ``allocate_slots`` as the scheduler calls it: with this step's lookup ``hit`` (an
        admission) or without (a running request).  Returns the fresh blocks that entered the table
    (external and new ones, not the adopted hits: those hold garbage until written), or None when
    out of blocks."""
    before = holds_blocks(inst, rid)
    table_before = set(get_table(inst, rid))
    num_hit = 0 if hit is None else int(hit.num_hit_tokens)
    manager, new = kvm.allocate_slots(
        inst.manager,
        inst.requests[rid],
        num_new_tokens,
        num_new_computed_tokens=num_hit,
        new_computed_blocks=hit,
        num_external_computed_tokens=num_external_tokens,
        delay_cache_blocks=delay_cache_blocks,
    )
    op = O.AllocateSlots(
        rid,
        num_new_tokens,
        num_new_computed_tokens=num_hit,
        use_computed_blocks=hit is not None,
        num_external_computed_tokens=num_external_tokens,
        delay_cache_blocks=delay_cache_blocks,
    )
    inst = _log(replace(inst, manager=manager), op, None if new is None else {"block_ids": [list(g) for g in new]})
    if new is None:
        return inst, None
    # Fresh blocks (external and new ones; not the adopted hits) hold garbage until written.
    fresh = tuple(b for b in get_table(inst, rid) if b not in table_before and b not in set(hit_ids(hit)))
    memory = dict(inst.memory)
    for b in fresh:
        memory[b] = None
    incarnation = dict(inst.incarnation)
    if not before and holds_blocks(inst, rid):
        incarnation[rid] = incarnation.get(rid, 0) + 1
    return replace(inst, memory=memory, incarnation=incarnation), fresh


def hit_ids(hit: ComputedBlocks | None) -> tuple[BlockId, ...]:
    return () if hit is None else tuple(hit.blocks[0]) if hit.blocks else ()


def cache(inst: InstanceState, rid: RequestId, num_tokens: int) -> InstanceState:
    """vLLM 0.33 ``cache_blocks``: publish the full blocks among the first ``num_tokens``."""
    manager = kvm.cache_blocks(inst.manager, inst.requests[rid], num_tokens)
    return _log(replace(inst, manager=manager), O.CacheBlocks(rid, num_tokens), None)


def free(inst: InstanceState, rid: RequestId) -> InstanceState:
    """vLLM 0.33 ``free`` (tail first; hashes kept)."""
    manager = kvm.free(inst.manager, rid)
    return _log(replace(inst, manager=manager), O.Free(rid), None)


# --- the data plane -----------------------------------------------------------------------------


def all_layers(num_layers: int) -> frozenset[int]:
    return frozenset(range(num_layers))


def compute(inst: InstanceState, rid: RequestId, start: int, end: int, num_layers: int) -> InstanceState:
    """A forward pass over tokens ``[start, end)``: every layer's KV of them lands in the table's
    blocks (each block's content is then the prefix up to its last written token)."""
    bs = get_block_size(inst)
    tokens = inst.requests[rid].all_token_ids
    table = get_table(inst, rid)
    memory = dict(inst.memory)
    for i in range(start // bs, -(-end // bs)):
        memory[table[i]] = (tuple(tokens[: min((i + 1) * bs, end)]), all_layers(num_layers))
    return replace(inst, memory=memory)


def land(inst: InstanceState, block: BlockId, content: Content | None, layers: frozenset[int]) -> InstanceState:
    """``layers`` of ``content`` arrive in ``block`` (other layers stay if they are of the same prefix)."""
    memory = dict(inst.memory)
    if content is None:
        memory[block] = None
    else:
        old = memory.get(block)
        kept = old[1] if old is not None and old[0] == content[0] else frozenset()
        memory[block] = (content[0], kept | (layers & content[1]))
    return replace(inst, memory=memory)


def holds_kv(content: Content | None, tokens: tuple[int, ...], upto: int, num_layers: int) -> bool:
    """``content`` is every layer of the KV of ``tokens[:upto]`` (a block's share of a prefix)."""
    return (
        content is not None
        and len(content[0]) >= upto
        and content[0][:upto] == tuple(tokens[:upto])
        and content[1] == all_layers(num_layers)
    )


def get_published_prefixes(inst: InstanceState) -> dict[bytes, tuple[int, ...]]:
    """Map key -> the token prefix a block stored under it must hold (from every request's hashes)."""
    bs = get_block_size(inst)
    out: dict[bytes, tuple[int, ...]] = {}
    for req in inst.requests.values():
        tokens = req.all_token_ids
        for i, h in enumerate(req.block_hashes):
            out[bytes(h) + GroupId(0).to_bytes(4, "big")] = tuple(tokens[: (i + 1) * bs])
    return out


def make_config(num_blocks: int, block_size: int, max_model_len: int) -> KVCacheConfig:
    """One full-attention group, prefix caching on: the P/D instances' manager."""
    from kvspec.spec.config import KVCacheConfig, full_attention
    from kvspec.spec.types import BlockCount, TokenCount

    return KVCacheConfig(BlockCount(num_blocks), (full_attention(block_size),), TokenCount(max_model_len))
