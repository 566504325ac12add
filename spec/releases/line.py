"""The supported vLLM releases, in order, and each one's profile.

``RELEASES`` lists every release kvspec models, oldest first.  ``CHANGES`` gathers the ``Change``
records of the per-release modules; ``profile_for(version)`` applies them to the 0.33.0 reading:
a change made in a release at or before ``version`` is in its ``after`` state, any other in its
``before`` state (a knob several releases changed takes the ``after`` of the newest change made, or
the ``before`` of the oldest one when none is).  So the profile of 0.33.0 is the base reading exactly
(a test checks it), and each release differs from its predecessor by the changes its own module lists.
"""

from __future__ import annotations

import functools
import re

from kvspec.spec.releases import v0_24, v0_25, v0_26, v0_27, v0_28, v0_29, v0_30, v0_31, v0_32, v0_33, v0_34
from kvspec.spec.releases.profile import BASE, Change, Profile

RELEASES: tuple[str, ...] = (
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)
"""Every vLLM release kvspec models, oldest first; 0.33.0 is the base reading."""

BASE_RELEASE = "0.33.0"
NEWEST = RELEASES[-1]

CHANGES: tuple[Change, ...] = (
    *v0_24.CHANGES,
    *v0_25.CHANGES,
    *v0_26.CHANGES,
    *v0_27.CHANGES,
    *v0_28.CHANGES,
    *v0_29.CHANGES,
    *v0_30.CHANGES,
    *v0_31.CHANGES,
    *v0_32.CHANGES,
    *v0_33.CHANGES,
    *v0_34.CHANGES,
)
"""Every modelled behaviour change, by release (oldest first)."""

FREE_ORDER_0_20 = BASE.with_knobs("vllm-0.20-free-order", None, free_order="append")
"""A what-if profile, no release: 0.33.0 with the free queue of vLLM 0.20 and earlier, where every
freed block goes to the tail (the ``v0_20`` family checks that targets honour a profile)."""

LEGACY_NAMES = {"vllm-0.33": "vllm-0.33.0"}
"""Profile names older traces carry."""


_VERSION = re.compile(r"^(\d+(?:\.\d+)*)")


class UnknownRelease(ValueError):
    """A vLLM version kvspec has no profile for; the message names the nearest known releases."""


def version_key(version: str) -> tuple[int, ...]:
    """``"0.25.1"`` -> ``(0, 25, 1)``; a local or dev suffix (``0.34.0+cpu``, ``0.35.0rc1``) is dropped."""
    m = _VERSION.match(version)
    if m is None:
        raise UnknownRelease(f"{version!r} is not a vLLM version number")
    return tuple(int(p) for p in m.group(1).split("."))


def is_known(version: str) -> bool:
    return version in RELEASES


def nearest_releases(version: str) -> tuple[str | None, str | None]:
    """The newest known release before ``version`` and the oldest after it (None where there is none)."""
    key = version_key(version)
    before = [r for r in RELEASES if version_key(r) < key]
    after = [r for r in RELEASES if version_key(r) > key]
    return (before[-1] if before else None, after[0] if after else None)


def require_known(version: str) -> str:
    """``version`` if kvspec models it, else ``UnknownRelease`` naming the nearest known releases."""
    if is_known(version):
        return version
    before, after = nearest_releases(version)
    near = " and ".join(r for r in (before, after) if r) or "none"
    raise UnknownRelease(
        f"vLLM {version} is not a release kvspec models (it knows {RELEASES[0]} to {NEWEST}; nearest: {near})"
    )


@functools.cache
def profile_for(version: str) -> Profile:
    """The profile of a known release: the base reading with every change placed before or after."""
    version = require_known(version)
    key = version_key(version)
    knobs: dict[str, object] = {}
    applied: list[str] = []
    for change in CHANGES:
        made = version_key(change.release) <= key
        if made:
            knobs[change.knob] = change.after
        elif change.knob not in knobs:  # a knob changed twice keeps the first change's "before"
            knobs[change.knob] = change.before
        if made != (version_key(change.release) <= version_key(BASE_RELEASE)):
            applied.append(change.name)
    return BASE.with_knobs(f"vllm-{version}", version, tuple(applied), **knobs)


def changes_between(old: str, new: str) -> tuple[Change, ...]:
    """The changes made after ``old`` up to ``new`` (or, for ``new`` older than ``old``, the ones undone)."""
    lo, hi = sorted((version_key(require_known(old)), version_key(require_known(new))))
    return tuple(c for c in CHANGES if lo < version_key(c.release) <= hi)


@functools.cache
def profile_named(name: str) -> Profile:
    """A profile by the name traces record: ``vllm-<release>``, a legacy name, or a what-if profile."""
    name = LEGACY_NAMES.get(name, name)
    if name == FREE_ORDER_0_20.name:
        return FREE_ORDER_0_20
    if name.startswith("vllm-") and is_known(name[len("vllm-") :]):
        return profile_for(name[len("vllm-") :])
    known = ", ".join([f"vllm-{r}" for r in RELEASES] + [FREE_ORDER_0_20.name])
    raise UnknownRelease(f"unknown profile {name!r} (known: {known})")


def all_profile_names() -> tuple[str, ...]:
    return tuple(f"vllm-{r}" for r in RELEASES) + (FREE_ORDER_0_20.name,)
