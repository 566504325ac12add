"""Run one operation list on a target under a release's profile: the release-change tests' driver.

``outcomes(target, release, config, ops)`` resets ``target`` for ``config`` under ``release``'s
profile and returns each operation's outcome.  The same list runs on the spec (``SpecTarget``) in
the tests, and on real vLLM of that release (``VllmTarget`` in a release's venv) when the vectors
are recorded: ``python -m tests.spec.releases.vectors`` prints what the installed vLLM answers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.targets.base import Target
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.releases.line import profile_for


def outcomes(target: Target, release: str, config: KVCacheConfig, ops: list[O.Op]) -> list[Any]:
    """Each outcome of ``ops`` on ``target``, reset for ``config`` under ``release``'s profile."""
    target.reset(replace(config, profile=profile_for(release)))
    return [target.apply(op) for op in ops]
