"""The same machine against the real vLLM 0.33 ``KVCacheManager`` (CI installs vLLM)."""

import pytest

from harness.check.machine import RunStats, make_machine, run_machine
from harness.check.settings import CheckSettings
from harness.run.catalogue import resolve
from harness.run.profiles import profile_settings
from harness.world.families import FAMILIES

pytestmark = [pytest.mark.vllm, pytest.mark.statemachine]


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_matches_spec(family):
    from harness.targets import TargetLoadError

    try:
        factory = resolve("vllm").factory
    except TargetLoadError as e:
        pytest.skip(str(e))
    stats = RunStats()
    cls = make_machine(family, factory, "vllm", CheckSettings(), stats)
    try:
        run_machine(cls, profile_settings("dev", max_examples=10, database=None), seed=7, shrink_seconds=30)
    except Exception:
        pytest.fail(stats.finding.summary() if stats.finding else "the machine raised without a finding")
