"""Replay every instance's manager calls on a real manager, one per instance.

The cluster model calls the spec manager; each ``InstanceState.log`` lists those calls as
``harness.core.ops`` operations with the spec's outcomes.  ``Mirror.replay`` feeds them to one
``harness.check.lockstep.Lockstep`` per instance (a fresh spec reference and a fresh target, by default
the real vLLM 0.33 ``KVCacheManager`` through ``harness.targets.vllm.VllmTarget``), which compares
outcomes and whole observations after each call, and checks that the target's outcome is the one
the cluster model acted on.  A restarted instance (``instance.RESET``) gets a fresh pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.harness.check.lockstep import FindingError, Lockstep
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.pd.instance import RESET
from kvspec.harness.pd.state import ClusterState, get_instances


def vllm_factory() -> Any:
    from kvspec.harness.targets.vllm import VllmTarget

    return VllmTarget()


class Mirror:
    """One lockstep (spec reference + target) per instance, fed the cluster's manager calls."""

    def __init__(self, factory: Callable[[], Any] = vllm_factory, relation: str = "exact") -> None:
        self.factory = factory
        self.relation = relation
        self.locksteps: dict[str, Lockstep] = {}
        self.calls = 0

    def replay(self, s: ClusterState) -> str | None:
        """Apply every logged call; a disagreement is returned as a sentence (None: all agree)."""
        for inst in get_instances(s):
            for op, outcome in inst.log:
                if op == RESET:
                    ls = Lockstep(inst.config, self.factory(), CheckSettings(relation=self.relation))
                    ls.start()
                    self.locksteps[inst.name] = ls
                    continue
                try:
                    got = self.locksteps[inst.name].apply(op)
                except FindingError as e:
                    return f"{inst.name}: {e.finding.summary()}"
                self.calls += 1
                if got != outcome:
                    return f"{inst.name}: {op.op} returned {got} on the target, the cluster model acted on {outcome}"
        return None
