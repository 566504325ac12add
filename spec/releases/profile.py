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

FinishFreeOrder = Literal["split", "append"]
"""How ``SingleTypeKVCacheManager.free`` (a finished or preempted request) queues its blocks in a
group that is not sliding window: ``split`` leaves it to ``BlockPool.free_blocks``; ``append`` puts
every block reaching 0 at the tail (vLLM 0.23, whose pool took the side from its caller)."""

CachingOffFreeOrder = Literal["front", "tail"]
"""Where ``BlockPool.free_blocks`` puts blocks reaching 0 when prefix caching is off: ``front``
(LIFO reuse) or ``tail`` (FIFO reuse; vLLM 0.27.x)."""


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
    finish_free_order: FinishFreeOrder = "split"
    caching_off_free_order: CachingOffFreeOrder = "front"

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
