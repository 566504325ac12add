"""A vLLM release as a profile: the 0.33.0 reading plus the named changes that separate it from 0.33.0.

The spec is written once, against vLLM 0.33.0 (the base reading).  Where a release behaves
otherwise, the spec asks the state's ``Profile`` a named question (``profile.free_order``,
``profile.hit_limit`` ...) instead of branching on version numbers.  Each answer is set by a
``Change``: the release that made it, the vLLM function it models, the value before and after.  A
release's profile is then computed, never written by hand: every change made up to that release is
in its ``after`` state, every later one in its ``before`` state (``spec.releases.line.profile_for``).

This module holds only the types; the changes live in one module per release (``v0_34.py`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal

FreeOrder = Literal["split", "append"]
"""How ``BlockPool.free_blocks`` queues blocks whose count reaches 0: ``split`` puts unhashed ones
at the front and hashed ones at the tail; ``append`` puts all of them at the tail."""

WindowFreeBasis = Literal["processed", "computed"]
"""The count ``allocate_slots`` measures the attention window on before freeing the blocks out of
it: ``processed`` leaves out the tokens of steps still in flight, ``computed`` is the whole
computed total (vLLM before 0.26, which has no in-flight count)."""

PartialTailBoundary = Literal["none", "prompt", "prompt_minus_one"]
"""Where a full-attention group wider than the hash block publishes the prompt tail as a partial
entry: nowhere, or at ``num_prompt_tokens`` / ``num_prompt_tokens - 1`` rounded down to hash blocks."""

HybridHitTrim = Literal["every_full_group", "first_group"]
"""Which full-attention spec groups a hybrid lookup cuts to the final hit length."""

ExternalAllocation = Literal["two_phase", "per_group"]
"""Admission across groups: every group adopts its hits before any allocates external-token
blocks (``two_phase``), or each group does both before the next (``per_group``)."""

CachePastHashes = Literal["cap", "raise"]
"""``cache_blocks`` asked for full blocks past the request's hashes: cache the hashed ones only, or
fail (vLLM indexes past the hash list)."""

FinishFreeOrder = Literal["split", "append"]
"""How ``SingleTypeKVCacheManager.free`` (a finished or preempted request) queues its blocks in a
group that is not sliding window: ``split`` leaves it to ``BlockPool.free_blocks``; ``append`` puts
every block reaching 0 at the tail (vLLM 0.23, whose pool took the side from its caller)."""

CachingOffFreeOrder = Literal["front", "tail"]
"""Where ``BlockPool.free_blocks`` puts blocks reaching 0 when prefix caching is off: ``front``
(LIFO reuse) or ``tail`` (FIFO reuse; vLLM 0.27.x)."""

NoneHashSeed = Literal["fixed", "random"]
"""Where ``NONE_HASH`` (the first block's parent) comes from when ``PYTHONHASHSEED`` is unset:
``fixed``: the hash of the constant seed ``"vllm-none-hash"``; ``random``: 32 random bytes drawn at
every ``init_none_hash`` (the spec stands for them with ``spec.hashing.RANDOM_NONE_HASH``)."""

ExtraKeyForm = Literal["bare", "tagged"]
"""How a block's extra keys are written: ``tagged``, each a tuple naming its source, the LoRA
adapter by name and path (``("lora", name, path)``, ``("mm", identifier, offset)``, ``("cache_salt",
salt)``, ``("prompt_embeds", digest)``); ``bare``, the values alone and the LoRA adapter by its name
only (``name``, ``(identifier, offset)``, ``salt``, ``digest``)."""

CoarseBlockKey = Literal["last_fine_hash", "concatenated"]
"""What keys a block of a group ``s`` hash blocks wide: the last of its ``s`` fine hashes (they chain,
so it names the whole prefix), or the bytes of all ``s`` concatenated."""

MMResumeScan = Literal["last_item", "window"]
"""Which multimodal items a block hashed after the request was created (output tokens completing
it) is keyed on: ``last_item``: only the request's last item, if it overlaps the block; ``window``:
every item overlapping the block, as for blocks hashed at creation."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Everything about the modelled manager that depends on the release.

    ``name`` is what traces record (``"vllm-0.34.0"``); ``release`` is the vLLM version, None for a
    what-if profile that no release has (``vllm-0.20-free-order``).  The remaining fields are the
    knobs; their defaults are vLLM 0.33.0's behaviour.
    """

    name: str = "vllm-0.33.0"
    release: str | None = "0.33.0"
    changes: tuple[str, ...] = field(default=(), compare=False)  # the changes applied to the base reading
    # --- knobs (0.33.0 values) ---
    free_order: FreeOrder = "split"
    hit_limit_from_logprob_start: bool = False  # 0.34: prompt logprobs bound the hit at their first row
    window_free_basis: WindowFreeBasis = "processed"
    partial_tail_boundary: PartialTailBoundary = "prompt_minus_one"
    hybrid_hit_trim: HybridHitTrim = "every_full_group"
    hybrid_single_spec_group: bool = True  # a hybrid whose groups all share one spec can be built
    external_allocation: ExternalAllocation = "two_phase"
    allocate_adopt_only: bool = True  # allocate_slots(0 new tokens) may adopt prefix hits alone
    cache_past_hashes: CachePastHashes = "cap"
    finish_free_order: FinishFreeOrder = "split"
    caching_off_free_order: CachingOffFreeOrder = "front"
    external_skip_clamp: Literal["tokens", "blocks"] = "tokens"  # 0.23: external tokens cut to the window per block
    # block hashing (spec.hashing)
    none_hash_seed: NoneHashSeed = "fixed"
    extra_key_form: ExtraKeyForm = "tagged"
    mm_resume_scan: MMResumeScan = "window"
    coarse_block_key: CoarseBlockKey = "last_fine_hash"

    def knobs(self) -> dict[str, object]:
        """The knob values only (what decides behaviour)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("name", "release", "changes")}

    def with_knobs(self, name: str, release: str | None, changes: tuple[str, ...] = (), **knobs: object) -> Profile:
        """This profile with some knobs set, under another name (``changes``: the ones applied)."""
        unknown = set(knobs) - set(self.knobs())
        assert not unknown, f"unknown profile knobs {sorted(unknown)}"
        return replace(self, name=name, release=release, changes=changes, **knobs)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Change:
    """One behaviour change a vLLM release made, as the spec models it.

    ``knob`` is the ``Profile`` field it sets, ``before`` its value up to the release before
    ``release``, ``after`` from ``release`` on.  ``models`` names the vLLM functions whose behaviour
    changed; ``summary`` says what changed, observably, in our words (docs/releases.md lists them).
    """

    name: str
    release: str
    models: str
    summary: str
    knob: str
    before: object
    after: object


BASE = Profile()
"""vLLM 0.33.0: the base reading."""
