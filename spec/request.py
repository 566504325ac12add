"""The request as the KV-cache manager sees it (vLLM 0.33 ``vllm/v1/request.py``, the fields it reads).

vLLM's scheduler owns the ``Request`` object and mutates it between manager calls; the spec keeps
it a value, so each scheduler-side change (``append_output_token_ids``, drafts, the computed count,
the status) returns a new request.  Block hashes are part of the value and are extended exactly as
vLLM's block hasher does after construction and after each append: full blocks only, never drafts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from kvspec.spec.config import HashAlgo, KVCacheConfig
from kvspec.spec.hashing import HashFeatures, MMFeature, extend_block_hashes
from kvspec.spec.releases.profile import BASE, Profile
from kvspec.spec.types import BlockHash, RequestId, TokenCount

PROCESS_HASH_SEED: str | None = os.environ.get("PYTHONHASHSEED")
"""vLLM 0.33 ``init_none_hash`` seeds NONE_HASH from ``PYTHONHASHSEED`` when it is set, once per
process; the spec reads it once too, so spec and vLLM agree in the same environment."""


class RequestStatus(str, Enum):
    """The statuses the manager's arithmetic depends on (the watermark applies to the first two
    and PREEMPTED; vLLM 0.33 ``RequestStatus`` has more, all of which act like RUNNING here)."""

    WAITING = "WAITING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    WAITING_FOR_REMOTE_KVS = "WAITING_FOR_REMOTE_KVS"


@dataclass(frozen=True, slots=True)
class Request:
    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    spec_token_ids: tuple[int, ...]  # drafts: not in all_token_ids, never hashed
    num_computed_tokens: TokenCount
    status: RequestStatus
    features: HashFeatures
    skip_reading_prefix_cache: bool  # prompt-logprob requests never read the prefix cache
    block_hashes: tuple[BlockHash, ...]
    hash_block_size: TokenCount
    hash_algo: HashAlgo
    hashing_enabled: bool  # vLLM installs the block hasher only when prefix caching is on
    num_in_flight_tokens: TokenCount = TokenCount(0)  # async scheduling only; always 0 here
    # Prompt logprobs asked with cache reads allowed (``skip_reading_prefix_cache=False``), scored
    # from this prompt row on; None: no such request (``get_prefix_cache_hit_limit``).
    prompt_logprob_start: TokenCount | None = None
    profile: Profile = BASE  # the release whose hashing rules made ``block_hashes`` (spec.hashing)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> TokenCount:
        """Prompt plus outputs; drafts excluded (vLLM ``Request.num_tokens``)."""
        return TokenCount(len(self.prompt_token_ids) + len(self.output_token_ids))

    @property
    def num_prompt_tokens(self) -> TokenCount:
        return TokenCount(len(self.prompt_token_ids))

    @property
    def num_tokens_with_spec(self) -> TokenCount:
        return TokenCount(self.num_tokens + len(self.spec_token_ids))


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    config: KVCacheConfig,
    *,
    lora: tuple[str, str] | None = None,
    mm_features: Sequence[MMFeature] = (),
    cache_salt: str | None = None,
    prompt_embeds: Sequence[bytes] | None = None,
    skip_reading_prefix_cache: bool = False,
    prompt_logprob_start: int | None = None,
) -> Request:
    """A new WAITING request with its full prompt blocks hashed (vLLM 0.33 ``Request.__init__``
    followed by the block hasher; EngineCore installs the hasher only when caching is on)."""
    if not prompt_token_ids:
        raise ValueError(f"request {request_id!r}: a prompt needs at least one token")
    if any(not isinstance(t, int) or isinstance(t, bool) for t in prompt_token_ids):
        raise ValueError(f"request {request_id!r}: prompt token ids must be ints")
    if prompt_logprob_start is not None and (skip_reading_prefix_cache or prompt_logprob_start < 0):
        raise ValueError(f"request {request_id!r}: prompt_logprob_start needs cache reads allowed and a row >= 0")
    features = HashFeatures(
        lora=lora,
        mm_features=tuple(sorted(mm_features, key=lambda m: m.offset)),
        cache_salt=cache_salt,
        prompt_embeds=None if prompt_embeds is None else tuple(prompt_embeds),
    )
    req = Request(
        request_id=RequestId(request_id),
        prompt_token_ids=tuple(prompt_token_ids),
        output_token_ids=(),
        spec_token_ids=(),
        num_computed_tokens=TokenCount(0),
        status=RequestStatus.WAITING,
        features=features,
        skip_reading_prefix_cache=skip_reading_prefix_cache,
        block_hashes=(),
        hash_block_size=config.hash_block_size,
        hash_algo=config.hash_algo,
        hashing_enabled=config.enable_caching,
        prompt_logprob_start=None if prompt_logprob_start is None else TokenCount(prompt_logprob_start),
        profile=config.profile,
    )
    return _rehash(req)


def _rehash(req: Request) -> Request:
    if not req.hashing_enabled:
        return req
    hashes = extend_block_hashes(
        req.block_hashes,
        req.all_token_ids,
        req.features,
        req.hash_block_size,
        req.hash_algo,
        PROCESS_HASH_SEED,
        req.profile,
    )
    return replace(req, block_hashes=hashes)


def recompute_block_hashes(
    req: Request, profile: Profile, known: tuple[Request, tuple[BlockHash, ...]] | None = None
) -> tuple[BlockHash, ...]:
    """The request's block hashes recomputed from its tokens under ``profile`` as its hashing calls
    made them: the prompt's full blocks at creation, then the rest.  Every multimodal item lies in
    the prompt, so this is exact whatever the later calls were (before vLLM 0.31 a later call keys
    only the last item, ``mm_resume_scan``; a prompt shorter than a block hashes nothing at
    creation, and the first call that does sees every item, which then all lie in its first block).
    ``known``: an earlier request and the hashes this function computed for it; when it has the
    same prompt and hashing inputs and the tokens it hashed begin ``req``'s, only the blocks after
    them are hashed (hashes chain, and, as just said, the history of calls does not matter)."""
    hbs, algo = req.hash_block_size, req.hash_algo
    if known is not None and _extends(known[0], len(known[1]), req):
        return extend_block_hashes(known[1], req.all_token_ids, req.features, hbs, algo, PROCESS_HASH_SEED, profile)
    at_creation = extend_block_hashes((), req.prompt_token_ids, req.features, hbs, algo, PROCESS_HASH_SEED, profile)
    return extend_block_hashes(at_creation, req.all_token_ids, req.features, hbs, algo, PROCESS_HASH_SEED, profile)


def _extends(earlier: Request, hashed_blocks: int, req: Request) -> bool:
    """Does ``req`` begin with the ``hashed_blocks`` blocks ``earlier`` hashed, from the same inputs?"""
    n = hashed_blocks * req.hash_block_size
    return (
        earlier.hash_block_size == req.hash_block_size
        and earlier.hash_algo == req.hash_algo
        and earlier.features == req.features
        and earlier.prompt_token_ids == req.prompt_token_ids
        and len(req.all_token_ids) >= n
        and req.all_token_ids[:n] == earlier.all_token_ids[:n]
    )


def append_output_token_ids(req: Request, token_ids: Sequence[int]) -> Request:
    """vLLM 0.33 ``Request.append_output_token_ids``: extend the outputs, then hash newly full blocks."""
    return _rehash(replace(req, output_token_ids=req.output_token_ids + tuple(token_ids)))


def with_spec_token_ids(req: Request, token_ids: Sequence[int]) -> Request:
    """The scheduler proposes drafts (vLLM ``request.spec_token_ids = ...``)."""
    return replace(req, spec_token_ids=tuple(token_ids))


def with_num_computed_tokens(req: Request, n: int) -> Request:
    """The scheduler advances, rolls back (rejection) or zeroes (preemption) the computed count.

    vLLM 0.33 counts every scheduled token, padded dummy drafts included, until the rejection
    rolls it back, so the count may pass ``num_tokens_with_spec`` for a while; only a negative
    count is a caller's bug."""
    if n < 0:
        raise ValueError(f"request {req.request_id!r}: num_computed_tokens must be >= 0, got {n}")
    return replace(req, num_computed_tokens=TokenCount(n))


def with_status(req: Request, status: RequestStatus) -> Request:
    return replace(req, status=status)


def get_prefix_cache_hit_limit(request: Request, profile: Profile) -> int | None:
    """How many leading tokens ``request`` may read from the prefix cache; None: no bound but the
    usual ``num_tokens - 1``.  Models vLLM 0.34 ``Request.get_prefix_cache_hit_limit``.

    A request that skips cache reads (prompt logprobs by default) gets 0 in every release.  Prompt
    logprobs asked with cache reads allowed read the whole cache up to 0.33; from 0.34
    (``profile.hit_limit_from_logprob_start``) they read it only up to their first scored row
    (``prompt_logprob_start``, 0 when scoring starts at the first row: no cache read at all).
    """
    if request.skip_reading_prefix_cache:
        return 0
    if profile.hit_limit_from_logprob_start and request.prompt_logprob_start is not None:
        return request.prompt_logprob_start
    return None
