"""An SGLang radix cache for one kvspec config, built the way SGLang's scheduler builds it, on a CPU.

SGLang 0.5.23 (``mem_cache/registry.py`` ``default_radix_cache_factory``) gives every model a
``UnifiedRadixCache`` over a ``ReqToTokenPool`` (one row of KV slot indices per running request)
and a token-to-KV pool allocator: ``TokenToKVPoolAllocator`` at page size 1, the paged one above.
kvspec's config maps onto it one to one: SGLang's page is the config's block (``page_size =
block_size``), its page ids are kvspec's block ids (page 0 is SGLang's padding page, as block 0 is
vLLM's null block), so the pool holds ``num_blocks - 1`` pages.  What SGLang cannot model is
declined (``Unsupported``, with the reason) before anything is built.

Full attention plus a sliding window (kvspec's ``hybrid_equal`` with one window group) is SGLang's
hybrid SWA model (``is_hybrid_swa``): an ``SWAKVPool`` of two page pools, an
``SWATokenToKVPoolAllocator`` that allocates a full page and a sliding-window page for every page of
a row (``full_to_swa_index_mapping`` pairs them), and the tree's FULL and SWA components.  vLLM's
hybrid groups draw from one pool of ``num_blocks - 1`` blocks, one block per group per page; SGLang
gets two pools of half that each (the full one takes an odd page), the same capacity.  kvspec's block
ids: full pages ``1..F``, sliding-window page ``s`` is block ``F + s`` (SGLang's padding page 0 of
either pool is the null block).  SGLang's window counts the tokens before the query
(``sliding_window_size``: Gemma 2's ``get_attention_sliding_window_size`` is the configured window
minus one), kvspec's counts the query too (vLLM's ``sliding_window``): ``W - 1`` here.

The tree core: SGLang picks a Rust core on Linux and falls back to its Python one
(``unified_cache/tree_core_registry.py``); both run the same tree operations, and only the Python
one lets a reader walk the nodes, which the observation needs (``observe``).  kvspec uses it.

Imports: harness.sglang.load, harness.targets, spec.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kvspec.harness.sglang.load import load_sglang
from kvspec.harness.targets.base import Unsupported
from kvspec.spec.config import KVCacheConfig

TREE_CORE = "python"
"""SGLang's Python tree core: the same operations as its Rust one, with nodes a reader can walk."""
ROWS = 64
"""Request rows in the ``ReqToTokenPool``: more than the world ever runs at once."""


@dataclass
class SglangCache:
    """One built cache: SGLang's row pool, allocator and tree, and the modules that drive them."""

    config: KVCacheConfig
    page_size: int
    num_pages: int  # usable full-attention pages, ids 1..num_pages
    rows: Any  # ReqToTokenPool
    allocator: Any
    tree: Any  # UnifiedRadixCache
    sg: dict[str, Any]  # the SGLang names the target calls (``sglang_names``)
    full_group: int = 0  # kvspec's group of the full-attention pool
    swa_group: int | None = None  # kvspec's group of the sliding-window pool, if there is one
    swa_pages: int = 0  # usable sliding-window pages, kvspec block ids num_pages + 1 .. num_pages + swa_pages
    window: int = 0  # SGLang's ``sliding_window_size``: tokens before the query it reads (kvspec's W - 1)

    @property
    def num_blocks(self) -> int:
        """kvspec's block ids: the null block, the full pages, the sliding-window pages."""
        return 1 + self.num_pages + self.swa_pages


def check_supported(config: KVCacheConfig) -> None:
    """``Unsupported`` naming what SGLang does not have for ``config``."""
    kinds = sorted(g.kind for g in config.groups)
    if kinds == ["full", "sliding_window"]:
        (window,) = (g.sliding_window for g in config.groups if g.kind == "sliding_window")
        if len({g.block_size for g in config.groups}) != 1:
            raise Unsupported("SGLang's full and sliding-window pools share one page size")
        if window is None or window < 2:
            raise Unsupported(
                f"a window of {window} token(s): SGLang's window counts the tokens before the query "
                "(W - 1) and must be positive"
            )
    elif kinds != ["full"]:
        raise Unsupported(
            "the sglang target drives full attention, alone or with one sliding window (SGLang's hybrid "
            f"SWA pools); this config has {[g.kind for g in config.groups]}"
        )
    if config.enable_kv_cache_events:
        raise Unsupported("SGLang publishes its own KV events, not vLLM's: the events family is vLLM's")
    if config.hash_block_size != config.groups[0].block_size:
        raise Unsupported("SGLang keys its tree by page; a hash block size other than the page is vLLM's")


SGLANG_NAMES = {
    "torch": ("torch", None),
    "FINISH_LENGTH": ("sglang.srt.managers.schedule_batch", "FINISH_LENGTH"),
    "Req": ("sglang.srt.managers.schedule_batch", "Req"),
    "alloc_paged_token_slots_decode": ("sglang.srt.mem_cache.allocation", "alloc_paged_token_slots_decode"),
    "alloc_paged_token_slots_extend": ("sglang.srt.mem_cache.allocation", "alloc_paged_token_slots_extend"),
    "alloc_req_slots": ("sglang.srt.mem_cache.allocation", "alloc_req_slots"),
    "alloc_token_slots": ("sglang.srt.mem_cache.allocation", "alloc_token_slots"),
    "checkpoint_kv_cache": ("sglang.srt.mem_cache.common", "checkpoint_kv_cache"),
    "evict_from_tree_cache": ("sglang.srt.mem_cache.common", "evict_from_tree_cache"),
    "match_kv_cache": ("sglang.srt.mem_cache.common", "match_kv_cache"),
    "release_kv_cache": ("sglang.srt.mem_cache.common", "release_kv_cache"),
    "PagedTokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator", "PagedTokenToKVPoolAllocator"),
    "TokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator", "TokenToKVPoolAllocator"),
    "CacheInitParams": ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),
    "MHATokenToKVPool": ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool"),
    "ReqToTokenPool": ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool"),
    "SWAKVPool": ("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool"),
    "SWATokenToKVPoolAllocator": ("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator"),
    "ComponentType": ("sglang.srt.mem_cache.unified_cache.components", "ComponentType"),
    "UnifiedRadixCache": ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"),
    "publish": ("sglang.srt.runtime_context", "publish"),
    "SamplingParams": ("sglang.srt.sampling.sampling_params", "SamplingParams"),
    "ServerArgs": ("sglang.srt.server_args", "ServerArgs"),
}
"""Every SGLang class and function the target calls: (module, attribute) by the name SGLang gives it."""


def sglang_names() -> dict[str, Any]:
    """``SGLANG_NAMES`` resolved, SGLang loaded first (``harness.sglang.load``)."""
    load_sglang()
    out = {}
    for name, (module, attr) in SGLANG_NAMES.items():
        found = importlib.import_module(module)
        out[name] = found if attr is None else getattr(found, attr)
    return out


def build_cache(config: KVCacheConfig) -> SglangCache:
    """SGLang's pools and tree for ``config`` (module docstring), on the CPU."""
    check_supported(config)
    sg = sglang_names()
    kinds = [g.kind for g in config.groups]
    page = config.groups[0].block_size
    # The scheduler publishes its server arguments before building pools; the model path is never opened.
    sg["publish"](sg["ServerArgs"](model_path="dummy", device="cpu", page_size=page), role="scheduler")
    rows = sg["ReqToTokenPool"](
        size=ROWS, max_context_len=config.max_model_len + 2 * page, device="cpu", enable_memory_saver=False
    )
    if "sliding_window" not in kinds:
        pages = config.num_blocks - 1
        allocator = _full_allocator(sg, page, pages)
        params = _params(sg, config, rows, allocator, page, (sg["ComponentType"].FULL,))
        return SglangCache(config, page, pages, rows, allocator, sg["UnifiedRadixCache"](params), sg)
    swa_group = kinds.index("sliding_window")
    window = config.groups[swa_group].sliding_window
    assert window is not None
    swa_pages = (config.num_blocks - 1) // 2
    pages = config.num_blocks - 1 - swa_pages
    allocator = _swa_allocator(sg, page, pages, swa_pages, rows)
    components = (sg["ComponentType"].FULL, sg["ComponentType"].SWA)
    params = _params(sg, config, rows, allocator, page, components, sliding_window_size=window - 1)
    tree = sg["UnifiedRadixCache"](params)
    return SglangCache(
        config, page, pages, rows, allocator, tree, sg, kinds.index("full"), swa_group, swa_pages, window - 1
    )


def _kv_pool_args(page: int) -> dict[str, Any]:
    """One float per slot: the cache's bookkeeping is what kvspec checks, not the KV values."""
    import torch

    return {"page_size": page, "dtype": torch.float32, "head_num": 1, "head_dim": 1, "device": "cpu"}


def _full_allocator(sg: dict[str, Any], page: int, pages: int) -> Any:
    """``MHATokenToKVPool`` and its allocator: per token at page size 1, paged above."""
    tokens = pages * page
    args = _kv_pool_args(page)
    kv = sg["MHATokenToKVPool"](size=tokens, layer_num=1, enable_memory_saver=False, **args)
    if page == 1:
        return sg["TokenToKVPoolAllocator"](tokens, dtype=args["dtype"], device="cpu", kvcache=kv, need_sort=False)
    return sg["PagedTokenToKVPoolAllocator"](
        tokens, page_size=page, dtype=args["dtype"], device="cpu", kvcache=kv, need_sort=False
    )


def _swa_allocator(sg: dict[str, Any], page: int, pages: int, swa_pages: int, rows: Any) -> Any:
    """``SWAKVPool`` (one full layer, one sliding-window layer) and ``SWATokenToKVPoolAllocator``."""
    args = _kv_pool_args(page)
    kv = sg["SWAKVPool"](
        size=pages * page,
        size_swa=swa_pages * page,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        **args,
    )
    return sg["SWATokenToKVPoolAllocator"](
        pages * page, swa_pages * page, page, args["dtype"], "cpu", kv, need_sort=False, req_to_token_pool=rows
    )


def _params(
    sg: dict[str, Any],
    config: KVCacheConfig,
    rows: Any,
    allocator: Any,
    page: int,
    components: tuple[Any, ...],
    sliding_window_size: int | None = None,
) -> Any:
    return sg["CacheInitParams"](
        disable=not config.enable_caching,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        tree_components=components,
        tree_core_backend=TREE_CORE,
        sliding_window_size=sliding_window_size,
    )
