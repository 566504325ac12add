"""The one reader of SGLang's state: its rows, pool and tree as a kvspec ``Observation``.

kvspec's vocabulary, for SGLang (one page = one block):

- a request's table: the pages of its ``ReqToTokenPool`` row (``row[i * page] // page``) up to its
  allocated length; with a sliding window, its sliding-window table is the pages those full slots
  map to (``full_to_swa_index_mapping``; 0, the null block, where the window's slots were freed), as
  kvspec block ids after the full pages (``harness.sglang.build``); its cached count: the pages of
  its tree-protected prefix (``cache_protected_len``), in every group;
- a page's reference count: how many live rows hold it (SGLang keeps none per page; its tree locks
  nodes, which SGLang's policy invariants check, ``spec.invariants.state_sglang``);
- the free queue: the allocator's free pages, in its order (the full pool's, then the window's);
- a page's key: kvspec's hash of the tokens on the tree path up to the end of that page, with the
  path's namespace (LoRA, salt) and its multimodal items (pad values, ``get_pad_value``) as
  features, so that equal keys mean equal KV under vLLM's rules and a tree page under a request's
  table must carry that request's hash (the engine-neutral §9.8, §9.10);
- ``facts``: what SGLang reports (sizes, ``sanity_check``) and the tree as walked, for §12.

Imports: harness.core, harness.sglang.build, spec.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

from kvspec.harness.core.observation import Observation
from kvspec.harness.sglang.build import SglangCache
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.hashing import MMFeature, get_group_block_hashes
from kvspec.spec.request import make_request
from kvspec.spec.types import BlockHash, GroupId, make_block_key


def observe_cache(c: SglangCache, natives: Mapping[str, Any], computed: Mapping[str, int]) -> Observation:
    """The observation of ``c`` with the requests ``natives`` (``SglRequest`` by id), ``computed``
    tokens each (what a request's next model run reads back from)."""
    p, n = c.page_size, c.num_blocks
    live = {rid: x for rid, x in natives.items() if x.admitted}
    groups = [c.full_group] + ([c.swa_group] if c.swa_group is not None else [])
    tables: list[dict[str, tuple[int, ...]]] = [{} for _ in groups]
    cached: list[dict[str, int]] = [{} for _ in groups]
    rows, windows = {}, {}
    ref_cnt = [0] * n
    for rid, x in live.items():
        kv = x.req.kv
        row = c.rows.req_to_token[kv.req_pool_idx, : kv.kv_allocated_len].tolist()
        rows[rid] = row
        tables[c.full_group][rid] = tuple(s // p for s in row[::p])
        if c.swa_group is not None:
            tables[c.swa_group][rid] = window_table(c, row)
            windows[rid] = max(0, computed.get(rid, 0) - c.window)
        for g in groups:
            cached[g][rid] = kv.cache_protected_len // p
            for b in tables[g][rid]:
                ref_cnt[b] += b != 0  # the null block's count is not kept
    nodes, keys, key_tokens, page_node = walk_tree(c)
    block_key: list[bytes | None] = [None] * n
    block_key_tokens: list[int | None] = [None] * n
    held: dict[bytes, tuple[int, ...]] = {}
    for b, key in keys.items():
        block_key[b], block_key_tokens[b] = key, key_tokens[b]
        held[key] = (*held.get(key, ()), b)
    reads = [[rid, b, page_node[b], "full"] for rid, t in tables[c.full_group].items() for b in t if b in page_node]
    if c.swa_group is not None:  # a window's pages: only those its next queries read
        for rid, t in tables[c.swa_group].items():
            reads += [[rid, b, page_node[b], "swa"] for b in t[windows[rid] // p :] if b in page_node]
    facts = {
        "sizes": get_pool_sizes(c),
        "tree": nodes,
        "sanity": _sanity(c),
        "live": len(live),
        "reads": reads,
        "rows": rows,
        "page_size": p,
    }
    return Observation(
        tables=tuple(tables),
        num_cached_block=tuple(cached),
        ref_cnt=tuple(ref_cnt),
        free_queue=tuple(int(b) for b in _free_pages(c)),
        block_key=tuple(block_key),
        cached=held,
        request_block_hashes={rid: tuple(x.hashes.block_hashes) for rid, x in natives.items()},
        block_key_tokens=tuple(block_key_tokens),
        facts=facts,
    )


def window_table(c: SglangCache, row: list[int]) -> tuple[int, ...]:
    """A row's sliding-window pages as kvspec block ids: the page its full slots map to, 0 where
    SGLang freed the window's slots (its mapping then reads 0, its padding slot)."""
    p, mapping = c.page_size, c.allocator.full_to_swa_index_mapping
    out = []
    for s in row[::p]:
        swa = int(mapping[s]) // p
        out.append(c.num_pages + swa if swa > 0 else 0)
    return tuple(out)


def walk_tree(c: SglangCache) -> tuple[list[list[Any]], dict[int, bytes], dict[int, int], dict[int, int]]:
    """The tree, walked from the root: its nodes (``[node, parent, tokens, lock_ref, pool]`` per pool
    the tree keeps, ``full`` and ``swa``), and per page it holds the page's key (the group's), the
    tokens the key covers and its node."""
    kinds = c.sg["ComponentType"]
    pools = [("full", kinds.FULL, c.full_group, 0)]
    if c.swa_group is not None:
        pools.append(("swa", kinds.SWA, c.swa_group, c.num_pages))
    p = c.page_size
    nodes: list[list[Any]] = []
    keys: dict[int, bytes] = {}
    key_tokens: dict[int, int] = {}
    page_node: dict[int, int] = {}
    root = c.tree.tree_core.root_node
    stack: list[tuple[Any, tuple[int, ...]]] = [(child, ()) for child in root.children.values()]
    while stack:
        node, before = stack.pop()
        path = before + tuple(node.key.token_ids)
        for pool, kind, group, offset in pools:
            data = node.component_data[kind]
            value = [] if data.value is None else data.value.tolist()
            parent = node.parent.id if node.parent is not None else None
            nodes.append([node.id, parent, len(value), data.lock_ref, pool])
            if not value:
                continue
            hashes = path_hashes(c.config, path, node.key.extra_key, node.key.cache_salt)
            for i in range(0, len(value), p):
                depth = (len(before) + i) // p
                page = offset + value[i] // p
                page_node[page] = node.id
                if depth < len(hashes):
                    keys[page] = make_block_key(hashes[depth], GroupId(group))
                    key_tokens[page] = (depth + 1) * p
        stack.extend((child, path) for child in node.children.values())
    return nodes, keys, key_tokens, page_node


PAD_BASE = 1 << 40
"""Pad values lie above every vocabulary (SGLang's own are hashes below 2**30, past its vocabularies)."""
_PADS: dict[int, tuple[str, int, int]] = {}  # pad value -> (item identifier, placeholder token, item length)


def get_pad_value(identifier: str, token: int, length: int) -> int:
    """The pad value of a multimodal item's placeholder ``token`` (deterministic: equal items pad
    alike in every run, as SGLang's hash of the item does).  An item's identifier fixes its length
    (its content fixes its placeholder count)."""
    digest = hashlib.sha256(f"{identifier}\0{token}".encode()).digest()
    pad = PAD_BASE + int.from_bytes(digest[:6], "big")
    _PADS[pad] = (identifier, token, length)
    return pad


def unpad(path: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[MMFeature, ...]]:
    """A tree path's tokens with pad values turned back into placeholder tokens, and its items: a
    run of one identifier's pads is a run of items of that identifier's length (an item cut by the
    path's end keeps its whole length, as the request that inserted it had it)."""
    tokens, items = list(path), []
    p = 0
    while p < len(path):
        if path[p] not in _PADS:
            p += 1
            continue
        identifier, _, length = _PADS[path[p]]
        items.append(MMFeature(identifier, p, length))
        for q in range(p, min(p + length, len(path))):
            tokens[q] = _PADS[path[q]][1] if path[q] in _PADS else path[q]
        p += length
    return tuple(tokens), tuple(items)


@functools.lru_cache(maxsize=4096)
def _chain(
    config: KVCacheConfig, path: tuple[int, ...], extra_key: str | None, salt: str | None
) -> tuple[BlockHash, ...]:
    lora = None
    if extra_key is not None and extra_key.startswith("lora:"):
        name, _, where = extra_key[len("lora:") :].partition(":")
        lora = (name, where)
    tokens, items = unpad(path)
    req = make_request("tree-path", tokens, config, lora=lora, mm_features=items, cache_salt=salt)
    bs, hbs = config.groups[0].block_size, config.hash_block_size
    return tuple(get_group_block_hashes(req.block_hashes, hbs, bs, config.profile))


def path_hashes(
    config: KVCacheConfig, path: tuple[int, ...], extra_key: str | None, salt: str | None
) -> tuple[BlockHash, ...]:
    """kvspec's hashes of a tree path's full pages, under the path's namespace (LoRA name and path,
    cache salt: ``harness.sglang.target.get_extra_key``), as the config hashes a request's."""
    if not path:
        return ()
    return _chain(config, path, extra_key, salt)


def get_pool_sizes(c: SglangCache) -> dict[str, dict[str, int]]:
    """What SGLang reports per pool, in tokens (a hybrid allocator's ``available_size`` is the
    smaller pool's: each pool is read on its own)."""
    a, tree, p = c.allocator, c.tree, c.page_size
    hybrid = c.swa_group is not None
    full = a.full_available_size() if hybrid else a.available_size()
    sizes = {"full": _pool_sizes(full, tree.evictable_size(), tree.protected_size(), c.num_pages * p)}
    if hybrid:
        swa = (a.swa_available_size(), tree.swa_evictable_size(), tree.swa_protected_size())
        sizes["swa"] = _pool_sizes(*swa, c.swa_pages * p)
    return sizes


def _pool_sizes(available: int, evictable: int, protected: int, total: int) -> dict[str, int]:
    return {"available": int(available), "evictable": int(evictable), "protected": int(protected), "total": total}


def _sanity(c: SglangCache) -> str | None:
    try:
        c.tree.sanity_check()
    except AssertionError as e:
        return str(e).strip().splitlines()[0][:300] or "AssertionError"
    return None


def _free_pages(c: SglangCache) -> list[int]:
    """The allocator's free pages, in its order (page size 1: its free slots are its pages); a
    hybrid's full pool's, then its window's (as kvspec block ids)."""
    if c.swa_group is None:
        return _pool_free_pages(c.allocator)
    swa = [c.num_pages + s for s in _pool_free_pages(c.allocator.swa_attn_allocator)]
    return _pool_free_pages(c.allocator.full_attn_allocator) + swa


def _pool_free_pages(allocator: Any) -> list[int]:
    pages: list[int] = allocator.free_pages.tolist()
    release = getattr(allocator, "release_pages", None)
    if release is not None and len(release):
        pages += release.tolist()
    return pages
