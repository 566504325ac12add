"""The installed vLLM release's ``KVCacheManager`` as a kvspec target (any release 0.23.0 to 0.34.0).

``VllmTarget`` drives an unmodified ``vllm.v1.core.kv_cache_manager.KVCacheManager`` (on CPU; no
model, engine or ``VllmConfig``) with real ``Request`` objects, and reports its state in the spec's
vocabulary.  It models the installed release: its ``profile`` is that release's
(``spec.releases``), and ``harness.targets.vllm_release`` probes what the adapter touches that
releases spell differently.  The harness treats it like any other target (``harness.targets.base.Target``):

* ``reset`` builds the manager from kvspec's ``KVCacheConfig`` with vLLM's own ``KVCacheConfig`` /
  ``KVCacheGroupSpec`` / ``*AttentionSpec`` classes (head count, head size and dtype are dummies: the
  manager never touches KV contents) and seeds vLLM's process-global ``NONE_HASH``.
* ``apply`` plays one ``harness.core.ops`` operation on the manager or on a request, as vLLM 0.33's
  scheduler would, and returns the outcome in the JSON form of ``base.py``.  vLLM's exceptions
  propagate unchanged: the harness turns them into findings.
* ``observe`` and ``glimpse`` read vLLM internals through ``harness.targets.vllm_observe`` (single-type
  managers' tables, the block pool's blocks, free list and hash map), with the requests' block
  hashes kept here.

vLLM is imported lazily, on the first ``VllmTarget()``: importing this module is free, and a missing
vLLM shows up as ``VllmUnavailable`` naming the install command.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Collection, Sequence
from types import SimpleNamespace
from typing import Any

from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.glimpse import Glimpse
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops import (
    AllocateSlots,
    AppendOutputTokens,
    MMFeatureSpec,
    Op,
    SetNumComputedTokens,
    SetNumInFlightTokens,
    SetSpecTokens,
    SetStatus,
)
from kvspec.harness.targets.adapter import ManagerAdapter
from kvspec.harness.targets.base import Unsupported, bind_release
from kvspec.harness.targets.vllm_observe import Reader, glimpse_manager, observe_manager
from kvspec.harness.targets.vllm_release import (
    ANY,
    ASSUME_ENV,
    ReleaseMismatch,
    probe,
    seed_none_hash,
    split_computed,
)
from kvspec.spec.config import AttentionSpec, KVCacheConfig
from kvspec.spec.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvspec.spec.hashing import get_none_hash
from kvspec.spec.releases.line import UnknownRelease
from kvspec.spec.releases.profile import Profile
from kvspec.spec.request import PROCESS_HASH_SEED
from kvspec.spec.types import BlockHash, GroupId, TokenCount

_MASK64 = (1 << 64) - 1


class VllmUnavailable(ImportError):
    """vLLM is not importable in this environment, or is a release kvspec does not model."""


_V: dict[str | None, SimpleNamespace] = {}  # by the release assumed for an unknown one (None: none)


def _vllm(assume_release: str | None = None) -> SimpleNamespace:
    """Import the pieces of vLLM the adapter uses and probe the release (once per process and assumed
    release; ~6 s).  ``assume_release``: the known release to model an unknown installed one as
    (``KVSPEC_VLLM_PROFILE``, read at the edges; harness.targets.vllm_release.installed_profile)."""
    if assume_release in _V:
        return _V[assume_release]
    try:
        import torch
        import vllm._version as version
        from vllm.distributed import kv_events
        from vllm.lora.request import LoRARequest
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
        from vllm.sampling_params import SamplingParams
        from vllm.utils import hashing
        from vllm.v1 import kv_cache_interface as kvi
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.block_pool import BlockHashToBlockMap
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.request import Request, RequestStatus
    except ImportError as e:  # pragma: no cover - exercised only without vLLM
        raise VllmUnavailable(f"the vllm target needs vLLM (install it with `ci/setup --vllm[=VERSION]`): {e}") from e
    # A refused reset_prefix_cache is a normal outcome here, not worth vLLM's warning per call.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    try:
        api = probe(
            version.__version__,
            KVCacheManager,
            kv_cache_utils.KVCacheBlock,
            BlockHashToBlockMap,
            SamplingParams,
            assume_release,
        )
    except UnknownRelease as e:
        raise VllmUnavailable(str(e)) from None
    for line in api.assumed:
        print(f"kvspec: {line}", file=sys.stderr)
    _V[assume_release] = SimpleNamespace(
        api=api,
        torch=torch,
        version=version,
        kv_events=kv_events,
        LoRARequest=LoRARequest,
        MultiModalFeatureSpec=MultiModalFeatureSpec,
        PlaceholderRange=PlaceholderRange,
        SamplingParams=SamplingParams,
        hashing=hashing,
        kvi=kvi,
        kv_cache_utils=kv_cache_utils,
        KVCacheManager=KVCacheManager,
        Request=Request,
        RequestStatus=RequestStatus,
    )
    return _V[assume_release]


def vllm_version() -> str:
    """``"vllm 0.33.0 (g4ba787ec9)"``: the release and the commit id from ``vllm/_version.py``."""
    version = importlib.import_module("vllm._version")
    commit = getattr(version, "__commit_id__", None)
    return f"vllm {version.__version__}" + (f" ({commit})" if commit else "")


# --- config -------------------------------------------------------------------------------------


def _make_attention_spec(v: SimpleNamespace, spec: AttentionSpec) -> Any:
    """kvspec ``AttentionSpec`` -> vLLM 0.33 ``FullAttentionSpec`` / ``SlidingWindowSpec`` /
    ``ChunkedLocalAttentionSpec`` / ``CrossAttentionSpec`` (one KV head of size 1: layout is irrelevant)."""
    common = dict(block_size=spec.block_size, num_kv_heads=1, head_size=1, dtype=v.torch.float32)
    if spec.kind == "full":
        return v.kvi.FullAttentionSpec(**common)
    if spec.kind == "sliding_window":
        return v.kvi.SlidingWindowSpec(**common, sliding_window=spec.sliding_window)
    if spec.kind == "chunked_local":
        return v.kvi.ChunkedLocalAttentionSpec(**common, attention_chunk_size=spec.attention_chunk_size)
    if spec.kind == "cross":
        return v.kvi.CrossAttentionSpec(**common)
    raise Unsupported(f"attention kind {spec.kind!r} has no vLLM 0.33 counterpart in this adapter")


def _make_vllm_kv_cache_config(v: SimpleNamespace, config: KVCacheConfig) -> Any:
    """vLLM 0.33 ``KVCacheConfig``: one ``KVCacheGroupSpec`` (one dummy layer) per kvspec group."""
    groups = [
        v.kvi.KVCacheGroupSpec([f"layer{gid}"], _make_attention_spec(v, g)) for gid, g in enumerate(config.groups)
    ]
    return v.kvi.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


# --- the target ---------------------------------------------------------------------------------


class VllmTarget(ManagerAdapter[Any]):
    """The installed vLLM's ``KVCacheManager``, driven through the kvspec ``Target`` protocol."""

    name = "vllm"

    def __init__(self, assume_release: str | None = None) -> None:
        super().__init__()
        self._v = _vllm(assume_release)
        self.api = self._v.api
        self.profile: Profile = self.api.profile  # the release this target models (bind_release)
        self._reader = Reader(self.api, self._key_tokens)
        self._manager: Any = None
        self._lora_ids: dict[str, int] = {}  # lora_name -> lora_int_id (not part of any hash)
        self._hash_by_low64: dict[int, bytes | None] = {}  # event int hash -> BlockHash (None: ambiguous)
        self._hash_blocks: dict[bytes, int] = {}  # request hash -> hash blocks it covers (1 for the first)
        self._hash_block_size = 1
        self._hash_memo: dict[str, tuple[bytes, ...]] = {}  # request id -> its observed block hashes

    @property
    def version(self) -> str:
        """The installed release (recorded in every trace), and the release it is modelled as when
        ``KVSPEC_VLLM_PROFILE`` names one: a report never hides the override."""
        if self.api.modelled_as:
            return f"{vllm_version()}, modelled as {self.api.modelled_as} ({ASSUME_ENV})"
        return vllm_version()

    # -- build --

    def build(self, config: KVCacheConfig) -> None:
        """A fresh vLLM ``KVCacheManager`` for ``config``, with ``NONE_HASH`` seeded for its hash algo.
        A config of another release runs under the installed one (``bind_release``); a what-if
        profile no release has is ``Unsupported``."""
        config = bind_release(config, self)
        if config.profile != self.profile:
            release, asked = self.profile.name, config.profile.name
            raise Unsupported(f"vLLM {self.api.version} follows profile {release!r}, not {asked!r}")
        v = self._v
        self._hash_fn = {"sha256": v.hashing.sha256, "sha256_cbor": v.hashing.sha256_cbor}[config.hash_algo]
        # NONE_HASH is a module global of vllm.v1.core.kv_cache_utils: re-derive it on every reset so
        # that switching algos between resets (or between two targets) never chains from a stale seed.
        spec_none_hash = get_none_hash(config.hash_algo, PROCESS_HASH_SEED, config.profile)
        self._none_hash = seed_none_hash(v.kv_cache_utils, self._hash_fn, spec_none_hash)
        # vLLM 0.33 EngineCore gives requests a block hasher only when prefix caching is on (or a KV
        # connector is configured, which kvspec does not model); otherwise block_hashes stays empty.
        self._block_hasher = (
            v.kv_cache_utils.get_request_block_hasher(config.hash_block_size, self._hash_fn)
            if config.enable_caching
            else None
        )
        wanted = dict(
            max_model_len=config.max_model_len,
            scheduler_block_size=config.scheduler_block_size,
            hash_block_size=config.hash_block_size,
            max_in_flight_tokens=config.max_in_flight_tokens,
            enable_caching=config.enable_caching,
            enable_kv_cache_events=config.enable_kv_cache_events,
            watermark=config.watermark,
        )
        try:
            kwargs = self.api.manager_kwargs(wanted, {"max_in_flight_tokens": None, "watermark": 0.0})
        except ReleaseMismatch as e:
            raise Unsupported(str(e)) from None
        self._manager = v.KVCacheManager(_make_vllm_kv_cache_config(v, config), **kwargs)
        self._lora_ids = {}
        self._hash_by_low64 = {}
        self._hash_blocks = {}
        self._hash_block_size = config.hash_block_size
        self._hash_memo = {}

    def _ensure_none_hash(self) -> None:
        """Put this target's ``NONE_HASH`` back if another target (or algo) replaced the global."""
        utils = self._v.kv_cache_utils
        if getattr(utils, "NONE_HASH", None) != self._none_hash:
            utils.NONE_HASH = self._none_hash

    def _remember_hashes(self, hashes: Any, start: int = 0) -> None:
        """Index a request's hashes ``start...`` by their low 64 bits: vLLM publishes event hashes as
        such ints by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``); every hash an event carries
        is a request hash.  Also note how many hash blocks each one covers (``_key_tokens``)."""
        table = self._hash_by_low64
        for i, h in enumerate(hashes, start + 1):
            low = int.from_bytes(h, "big") & _MASK64
            known = table.get(low, h)
            table[low] = bytes(h) if known == h else None
            self._hash_blocks[bytes(h)] = i

    def _key_tokens(self, key: bytes | None) -> int | None:
        """The prefix tokens a block's key covers, for a release whose blocks do not record it (vLLM
        0.23, where every key is a full block's): the key is a request hash (or, for a group wider than
        the hash block, 0.23's concatenation of them, which ends with the last) and 4 bytes of group
        id, and the hash at request position i covers (i + 1) hash blocks.  None: no request made it."""
        if key is None:
            return None
        h = bytes(key[:-4])
        n = self._hash_blocks.get(h)
        if n is None and self._hash_blocks:
            n = self._hash_blocks.get(h[-len(next(iter(self._hash_blocks))) :])
        return None if n is None else n * self._hash_block_size

    # -- requests --

    def new_request(self, r: BookRequest) -> Any:
        """vLLM 0.33 ``Request(...)`` with the block hasher (hashes every full block of the prompt)."""
        v = self._v
        self._ensure_none_hash()
        lora = None
        if r.lora is not None:
            lora_name, lora_path = r.lora  # passed through untouched: sha256 pickles these very objects
            lora_int_id = self._lora_ids.setdefault(lora_name, len(self._lora_ids) + 1)
            lora = v.LoRARequest(lora_name=lora_name, lora_int_id=lora_int_id, lora_path=lora_path)
        embeds = _make_prompt_embeds(v, r.prompt_embeds)
        request = v.Request(
            request_id=r.request_id,
            # A pure-embeddings prompt reaches vLLM without token ids (all_token_ids become zeros).
            prompt_token_ids=None if embeds is not None and not any(r.prompt_token_ids) else list(r.prompt_token_ids),
            prompt_embeds=embeds,
            sampling_params=self._sampling_params(r),
            pooling_params=None,
            mm_features=[_make_mm_feature(v, m) for m in r.mm_features] or None,
            lora_request=lora,
            cache_salt=r.cache_salt,
            block_hasher=self._block_hasher,
        )
        self._remember_hashes(request.block_hashes)
        return request

    def _sampling_params(self, r: BookRequest) -> Any:
        """Prompt logprobs make ``SamplingParams`` skip prefix-cache reads by default (its
        ``__post_init__``); a request that allows them says ``skip_reading_prefix_cache=False`` and
        scores from ``prompt_logprob_start`` (passed to releases whose ``SamplingParams`` has it)."""
        if r.prompt_logprob_start is None:
            return self._v.SamplingParams(max_tokens=16, prompt_logprobs=1 if r.skip_reading_prefix_cache else None)
        start = {"prompt_logprob_start": r.prompt_logprob_start} if self.api.logprob_start else {}
        return self._v.SamplingParams(max_tokens=16, prompt_logprobs=1, skip_reading_prefix_cache=False, **start)

    def update_request(self, request: Any, r: BookRequest, op: Op) -> Any:
        """The scheduler's own change to the vLLM ``Request``."""
        if isinstance(op, AppendOutputTokens):
            self._ensure_none_hash()
            before = len(request.block_hashes)
            request.append_output_token_ids(list(op.token_ids))
            self._remember_hashes(request.block_hashes[before:], before)
        elif isinstance(op, SetSpecTokens):
            request.spec_token_ids = list(op.token_ids)
        elif isinstance(op, SetNumComputedTokens):
            request.num_computed_tokens = op.num_computed_tokens
        elif isinstance(op, SetNumInFlightTokens):
            request.num_in_flight_tokens = op.num_in_flight_tokens
        elif isinstance(op, SetStatus):
            request.status = self._v.RequestStatus[op.status]
        return request

    # -- manager calls --

    def get_computed_blocks(self, request: Any) -> tuple[Any, list[list[int]], int]:
        """``get_computed_blocks(request)``; the book keeps the blocks for this request's next
        ``allocate_slots`` with ``use_computed_blocks`` (which consumes them)."""
        blocks, num_hit_tokens = split_computed(self._manager.get_computed_blocks(request))
        return blocks, _block_ids(blocks), num_hit_tokens

    def allocate_slots(self, request: Any, op: AllocateSlots, new_computed_blocks: Any) -> list[list[int]] | None:
        """``allocate_slots``; ``new_computed_blocks`` is this request's lookup when
        ``use_computed_blocks``, else None (the scheduler's running-request call)."""
        try:
            kwargs = self.api.allocate_kwargs(op.manager_kwargs(new_computed_blocks), _ALLOCATE_DEFAULTS)
        except ReleaseMismatch as e:
            raise Unsupported(str(e)) from None
        new_blocks = self._manager.allocate_slots(request, op.num_new_tokens, **kwargs)
        return None if new_blocks is None else _block_ids(new_blocks)

    def free(self, request: Any, request_id: str) -> None:
        self._manager.free(request)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self._manager.cache_blocks(request, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        self._manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        self._manager.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        return bool(self._manager.reset_prefix_cache())

    def take_events(self) -> list[Event]:
        return [self._to_spec_event(e) for e in self._manager.take_events()]

    # -- events --

    def _block_hash(self, h: bytes | int) -> BlockHash:
        """An event hash (raw bytes, or vLLM's low-64-bit int form) as the full ``BlockHash`` bytes."""
        if isinstance(h, bytes):
            return BlockHash(bytes(h))
        full = self._hash_by_low64.get(h, b"")
        if not full:
            why = "is ambiguous" if full is None else "matches no request hash"
            raise ValueError(f"vLLM event hash {h:#x} {why}; cannot recover its BlockHash bytes")
        return BlockHash(full)

    def _to_spec_event(self, e: Any) -> Event:
        """vLLM 0.33 ``kv_events`` event -> kvspec ``spec.events`` event."""
        ev = self._v.kv_events
        if isinstance(e, ev.BlockStored):
            parent = e.parent_block_hash
            return BlockStored(
                block_hashes=tuple(self._block_hash(h) for h in e.block_hashes),
                parent_block_hash=None if parent is None else self._block_hash(parent),
                token_ids=tuple(e.token_ids),
                block_size=TokenCount(e.block_size),
                group_id=GroupId(e.group_idx),
            )
        if isinstance(e, ev.BlockRemoved):
            return BlockRemoved(
                block_hashes=tuple(self._block_hash(h) for h in e.block_hashes), group_id=GroupId(e.group_idx)
            )
        if isinstance(e, ev.AllBlocksCleared):
            return AllBlocksCleared()
        raise TypeError(f"unexpected vLLM KV-cache event {e!r}")

    # -- observe --

    def observe(self) -> Observation:
        """The manager's state in the spec's vocabulary (``harness.targets.vllm_observe``)."""
        manager = self._built("observe")
        hashes = {rid: self._observed_hashes(rid, r) for rid, r in self.book.native.items()}
        return observe_manager(manager, self._reader, hashes)

    def glimpse(self, requests: Sequence[str], blocks: Collection[int], keys: Collection[bytes]) -> Glimpse:
        """The part of the manager's state one operation of ``requests`` can change
        (``harness.core.glimpse``), read without walking the pool or the free list."""
        return glimpse_manager(self._built("glimpse"), self._reader, self.glimpse_hashes, requests, blocks, keys)

    def _built(self, what: str) -> Any:
        """The manager, once ``reset`` built it."""
        if self._manager is None:
            raise ValueError(f"VllmTarget.{what} called before reset(config)")
        return self._manager

    def glimpse_hashes(self, rid: str) -> tuple[bytes, ...] | None:
        """The observed block hashes of a request in the book, None for an unknown one (``glimpse``
        reads them; ``harness.check.glimpsing`` alone, after a request operation)."""
        r = self.book.native.get(rid)
        return None if r is None else self._observed_hashes(rid, r)

    def _observed_hashes(self, rid: str, request: Any) -> tuple[bytes, ...]:
        """``request.block_hashes`` as a tuple, re-read only when the list changed: vLLM only appends
        to it, so an unchanged length and an identical last element mean an unchanged list."""
        hashes = request.block_hashes
        memo = self._hash_memo.get(rid)
        if memo is not None and len(memo) == len(hashes) and (not hashes or memo[-1] is hashes[-1]):
            return memo
        memo = self._hash_memo[rid] = tuple(hashes)
        return memo


def _make_mm_feature(v: SimpleNamespace, m: MMFeatureSpec) -> Any:
    """vLLM 0.33 ``MultiModalFeatureSpec``: the block hasher reads ``identifier`` and
    ``mm_position.offset`` / ``.length`` only; the processed data may be None (cached item)."""
    return v.MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=m.identifier,
        mm_position=v.PlaceholderRange(offset=m.offset, length=m.length),
    )


def _make_prompt_embeds(v: SimpleNamespace, rows: tuple[str, ...] | None) -> Any:
    """The ``prompt_embeds`` tensor (float32, one row per prompt position) whose raw bytes are the
    hex rows: vLLM 0.33 hashes ``tensor_data(prompt_embeds[start:end])``, i.e. exactly these bytes."""
    if rows is None:
        return None
    raw = bytearray(b"".join(bytes.fromhex(row) for row in rows))
    return v.torch.frombuffer(raw, dtype=v.torch.float32).reshape(len(rows), -1)


_ALLOCATE_DEFAULTS = {"has_scheduled_reqs": ANY}  # meaningless without a watermark (before 0.24)


def _block_ids(blocks: Any) -> list[list[int]]:
    """``KVCacheBlocks.get_block_ids()`` as JSON lists, one per group."""
    return [list(ids) for ids in blocks.get_block_ids()]


__all__ = ["VllmTarget", "VllmUnavailable", "vllm_version"]
