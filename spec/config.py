"""Configuration of the modelled manager: attention specs, groups, and the behaviour profile.

Mirrors vLLM 0.33's ``KVCacheConfig`` / ``KVCacheGroupSpec`` / ``*AttentionSpec`` and the
``KVCacheManager`` constructor arguments that matter for allocation, and nothing else (no dtype,
no head sizes: the spec never touches KV contents).  ``validate`` turns a config that cannot exist
into a ``ConfigError`` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from kvspec.spec.releases.profile import BASE, Profile
from kvspec.spec.types import BlockCount, TokenCount

AttentionKind = Literal["full", "sliding_window", "chunked_local", "cross"]
HashAlgo = Literal["sha256", "sha256_cbor"]


class ConfigError(ValueError):
    """A configuration that vLLM would refuse or that cannot exist."""


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """One KV-cache group's layer type (vLLM 0.33 ``FullAttentionSpec``, ``SlidingWindowSpec``,
    ``ChunkedLocalAttentionSpec``, ``CrossAttentionSpec``)."""

    kind: AttentionKind
    block_size: TokenCount
    sliding_window: TokenCount | None = None  # kind == "sliding_window"
    attention_chunk_size: TokenCount | None = None  # kind == "chunked_local"

    @property
    def is_prefix_cacheable(self) -> bool:
        """Cross-attention KV depends on the encoder input, not on the token prefix."""
        return self.kind != "cross"

    @property
    def manager_key(self) -> tuple[object, ...]:
        """Groups with equal keys are looked up jointly (vLLM 0.33 hybrid 'SpecGroup')."""
        return (self.kind, self.block_size, self.sliding_window, self.attention_chunk_size)


def full_attention(block_size: int) -> AttentionSpec:
    return AttentionSpec("full", TokenCount(block_size))


def sliding_window(block_size: int, window: int) -> AttentionSpec:
    return AttentionSpec("sliding_window", TokenCount(block_size), sliding_window=TokenCount(window))


def chunked_local(block_size: int, chunk: int) -> AttentionSpec:
    return AttentionSpec("chunked_local", TokenCount(block_size), attention_chunk_size=TokenCount(chunk))


def cross_attention(block_size: int) -> AttentionSpec:
    return AttentionSpec("cross", TokenCount(block_size))


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """Everything that fixes the manager's behaviour.

    ``num_blocks`` counts the null block (vLLM's ``num_gpu_blocks``), so ``num_blocks - 1`` are
    usable.  ``hash_block_size`` defaults to the GCD of the prefix-cacheable groups' block sizes,
    ``scheduler_block_size`` is their LCM (vLLM 0.33 ``hash_block_size`` / ``scheduler_block_size``).
    """

    num_blocks: BlockCount
    groups: tuple[AttentionSpec, ...]
    max_model_len: TokenCount
    enable_caching: bool = True
    hash_algo: HashAlgo = "sha256"
    enable_kv_cache_events: bool = False
    watermark: float = 0.0
    max_in_flight_tokens: TokenCount | None = None
    profile: Profile = BASE  # the vLLM release modelled (spec.releases)
    hash_block_size_override: TokenCount | None = field(default=None)
    # Derived once (the harness reads them on every step): see the class docstring.
    hash_block_size: TokenCount = field(init=False, repr=False, compare=False)
    scheduler_block_size: TokenCount = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every = [g.block_size for g in self.groups]
        if not all(isinstance(b, int) and b > 0 for b in every):
            every = []  # validate() names the bad field
        cacheable = [g.block_size for g in self.groups if g.is_prefix_cacheable and g.block_size in every] or every
        hbs = self.hash_block_size_override if self.hash_block_size_override is not None else math.gcd(*cacheable)
        object.__setattr__(self, "hash_block_size", TokenCount(hbs))
        object.__setattr__(self, "scheduler_block_size", TokenCount(math.lcm(*every)))

    @property
    def watermark_blocks(self) -> BlockCount:
        """vLLM 0.33 ``KVCacheManager.__init__``: ``int(watermark * num_blocks)``."""
        return BlockCount(int(self.watermark * self.num_blocks))

    def validate(self) -> KVCacheConfig:
        """Raise ``ConfigError`` naming the first field that makes this config impossible."""
        if not isinstance(self.num_blocks, int) or self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be an int >= 1 (block 0 is the null block), got {self.num_blocks!r}")
        if not self.groups:
            raise ConfigError("groups must name at least one KV-cache group")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be an int >= 1, got {self.max_model_len!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.max_in_flight_tokens is not None and self.max_in_flight_tokens < 0:
            raise ConfigError(f"max_in_flight_tokens must be >= 0, got {self.max_in_flight_tokens!r}")
        if self.hash_algo not in ("sha256", "sha256_cbor"):
            raise ConfigError(f"hash_algo must be 'sha256' or 'sha256_cbor', got {self.hash_algo!r}")
        for gid, g in enumerate(self.groups):
            where = f"groups[{gid}] ({g.kind})"
            if g.kind not in ("full", "sliding_window", "chunked_local", "cross"):
                raise ConfigError(f"{where}: unknown attention kind {g.kind!r}")
            if not isinstance(g.block_size, int) or g.block_size < 1:
                raise ConfigError(f"{where}: block_size must be an int >= 1, got {g.block_size!r}")
            if g.kind == "sliding_window" and (g.sliding_window is None or g.sliding_window < 1):
                raise ConfigError(f"{where}: sliding_window must be an int >= 1, got {g.sliding_window!r}")
            if g.kind != "sliding_window" and g.sliding_window is not None:
                raise ConfigError(f"{where}: sliding_window is only meaningful for sliding-window groups")
            if g.kind == "chunked_local" and (g.attention_chunk_size is None or g.attention_chunk_size < 1):
                raise ConfigError(f"{where}: attention_chunk_size must be an int >= 1, got {g.attention_chunk_size!r}")
            if g.kind != "chunked_local" and g.attention_chunk_size is not None:
                raise ConfigError(f"{where}: attention_chunk_size is only meaningful for chunked-local groups")
        if self.enable_caching and any(g.kind == "cross" for g in self.groups):
            # vLLM 0.33: CrossAttentionManager.cache_blocks raises; encoder-decoder models run uncached.
            raise ConfigError("cross-attention groups require enable_caching=False (vLLM cannot cache them)")
        hbs = self.hash_block_size
        for gid, g in enumerate(self.groups):
            if g.is_prefix_cacheable and g.block_size % hbs != 0:
                raise ConfigError(
                    f"groups[{gid}]: block_size {g.block_size} is not a multiple of hash_block_size {hbs}"
                )
        if self.enable_caching and len(self.groups) > 1 and not self.profile.hybrid_single_spec_group:
            # vLLM before 0.29 (Change hybrid_allows_single_cacheable_spec_group): the hybrid
            # coordinator asserts that its groups have at least two distinct specs.
            if len({g.manager_key for g in self.groups if g.is_prefix_cacheable}) < 2:
                raise ConfigError(
                    f"vLLM {self.profile.release} cannot build a hybrid coordinator whose groups all share one spec"
                )
        if self.enable_caching and len(self.groups) == 1 and hbs != self.groups[0].block_size:
            # vLLM 0.33 UnitaryKVCacheCoordinator asserts hash_block_size == block_size.
            raise ConfigError(
                f"a single group needs hash_block_size == block_size, got {hbs} != {self.groups[0].block_size}"
            )
        return self
