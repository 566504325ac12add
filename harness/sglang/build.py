"""An SGLang radix cache for one kvspec config, built the way SGLang's scheduler builds it, on a CPU.

SGLang 0.5.23 (``mem_cache/registry.py`` ``default_radix_cache_factory``) gives every model a
``UnifiedRadixCache`` over a ``ReqToTokenPool`` (one row of KV slot indices per running request)
and a token-to-KV pool allocator: ``TokenToKVPoolAllocator`` at page size 1, the paged one above.
kvspec's config maps onto it one to one: SGLang's page is the config's block (``page_size =
block_size``), its page ids are kvspec's block ids (page 0 is SGLang's padding page, as block 0 is
vLLM's null block), so the pool holds ``num_blocks - 1`` pages.  What SGLang cannot model is
declined (``Unsupported``, with the reason) before anything is built.

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
    num_pages: int  # usable pages, ids 1..num_pages
    rows: Any  # ReqToTokenPool
    allocator: Any
    tree: Any  # UnifiedRadixCache
    sg: dict[str, Any]  # the SGLang names the target calls (``sglang_names``)


def check_supported(config: KVCacheConfig) -> None:
    """``Unsupported`` naming what SGLang does not have for ``config``."""
    kinds = [g.kind for g in config.groups]
    if kinds != ["full"]:
        raise Unsupported(
            "the sglang target drives full attention (SGLang's full + SWA pools are not driven yet); "
            f"this config has {kinds}"
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
    import torch

    check_supported(config)
    sg = sglang_names()
    page = config.groups[0].block_size
    num_pages = config.num_blocks - 1
    tokens = num_pages * page
    # The scheduler publishes its server arguments before building pools; the model path is never opened.
    sg["publish"](sg["ServerArgs"](model_path="dummy", device="cpu", page_size=page), role="scheduler")
    rows = sg["ReqToTokenPool"](
        size=ROWS, max_context_len=config.max_model_len + 2 * page, device="cpu", enable_memory_saver=False
    )
    kv = sg["MHATokenToKVPool"](
        size=tokens,
        page_size=page,
        dtype=torch.float32,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    if page == 1:
        allocator = sg["TokenToKVPoolAllocator"](tokens, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False)
    else:
        allocator = sg["PagedTokenToKVPoolAllocator"](
            tokens, page_size=page, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False
        )
    params = sg["CacheInitParams"](
        disable=not config.enable_caching,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        tree_components=(sg["ComponentType"].FULL,),
        tree_core_backend=TREE_CORE,
    )
    tree = sg["UnifiedRadixCache"](params)
    return SglangCache(config, page, num_pages, rows, allocator, tree, sg)
