"""The protocol every target implements, and the errors it may raise.

A target is one KV-cache manager under test (the spec itself, real vLLM, kvspec's ``impl``, or a
user's own).  The harness only ever talks to it through this protocol: ``reset`` builds a fresh
manager for a config, ``apply`` performs one abstract operation (``harness.core.ops``) and returns its
outcome in JSON form, and ``observe`` reports the manager's state as an ``Observation``.  ``observe``
is the one function per target that reads the target's internals.

Outcome forms (JSON values, identical across targets):
- ``GetComputedBlocks``: ``{"block_ids": [[int, ...] per group], "num_hit_tokens": int}``
- ``AllocateSlots``: ``None`` when out of blocks, else ``{"block_ids": [[int, ...] per group]}``
  (only the newly allocated blocks; empty lists when nothing new was needed)
- ``ResetPrefixCache``: ``bool``
- ``TakeEvents``: ``[event_to_json(e), ...]`` (see ``harness.core.observation``)
- every other operation: ``None``
A target that models one vLLM release says so with a ``profile`` attribute (a ``spec.releases``
``Profile``, e.g. the installed vLLM's): ``bind_release`` then runs every config under that profile.
A target declares the engine whose policy it follows with an ``engine`` attribute (default ``vllm``;
``get_target_engine``): the invariants in force are the engine-neutral ones and that engine's policy
(``spec.invariants``). A target of another engine may also fix scheduler knobs (``sched_limits``)
and decline whole families with a reason (``declined_families``). A target that cannot model an
operation or config raises ``Unsupported`` (the harness then skips that family or step kind for this
target, and says so); any other exception is a finding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops import Op
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.releases.profile import Profile


class Unsupported(Exception):
    """The target does not model this config or operation (not a bug in the target)."""


@runtime_checkable
class Target(Protocol):
    name: str

    @property
    def version(self) -> str:
        """Free-form version string recorded in reports (e.g. ``vllm 0.33.0``)."""
        ...

    def reset(self, config: KVCacheConfig) -> None:
        """Discard all state and build a fresh manager for ``config``."""
        ...

    def apply(self, op: Op) -> Any:
        """Perform one operation; return its outcome in the JSON form above."""
        ...

    def observe(self) -> Observation:
        """The manager's current state in the spec's vocabulary."""
        ...


def get_target_profile(target: object) -> Profile | None:
    """The release a target models (its ``profile`` attribute, or that of the target a wrapper holds
    as ``inner``: the KV-content oracle, the ledger), None for a target that follows the config."""
    for _ in range(8):  # wrappers of wrappers, not a cycle
        profile = getattr(target, "profile", None)
        if isinstance(profile, Profile):
            return profile
        target = getattr(target, "inner", None)
        if target is None:
            break
    return None


def get_target_engine(target: object) -> str:
    """The engine whose policy a target follows: its ``engine`` attribute (or that of the target a
    wrapper holds as ``inner``), else ``vllm``.  A target that is not vLLM's kind of manager declares
    another (``sglang``, or any name of its own: then only the engine-neutral invariants apply)."""
    engine = _declared(target, "engine")
    return engine if isinstance(engine, str) and engine else "vllm"


def _declared(target: object, attribute: str) -> Any:
    """``attribute`` of the target, or of the target a wrapper holds as ``inner``; None if neither has it."""
    for _ in range(8):
        value = getattr(target, attribute, None)
        if value is not None:
            return value
        target = getattr(target, "inner", None)
        if target is None:
            break
    return None


def get_declined_families(target: object) -> dict[str, str]:
    """The families a target declares it does not model, each with why (``declined_families``): the
    run skips them and says so, instead of discarding every example it draws."""
    declined = _declared(target, "declined_families")
    return dict(declined) if isinstance(declined, dict) else {}


def get_sched_limits(target: object) -> dict[str, Any]:
    """The scheduler knobs a target fixes (``sched_limits``: ``harness.world.workload.SchedConfig``
    fields and their values): features of vLLM's scheduler the target's engine does not have, so the
    world never draws them for it (SGLang: no vLLM KV connector, no drafts)."""
    limits = _declared(target, "sched_limits")
    return dict(limits) if isinstance(limits, dict) else {}


def bind_release(config: KVCacheConfig, target: object) -> KVCacheConfig:
    """``config`` under the release ``target`` models: a config drawn (or replayed) for one release
    runs under the target's, so one workload checks every release.  A what-if profile (no release,
    e.g. ``vllm-0.20-free-order``) stays as it is: the target then refuses it (``Unsupported``)."""
    profile = get_target_profile(target)
    if profile is None or config.profile.release is None or config.profile == profile:
        return config
    return replace(config, profile=profile)
