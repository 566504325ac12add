"""The same machine against the real vLLM 0.33 ``KVCacheManager`` (CI installs vLLM)."""

import pytest

from kvspec.harness.run.catalogue import resolve
from kvspec.harness.world.families import FAMILIES

pytestmark = [pytest.mark.vllm, pytest.mark.statemachine]


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_matches_spec(family, machine_run):
    from kvspec.harness.targets import TargetLoadError

    try:
        factory = resolve("vllm").factory
    except TargetLoadError as e:
        pytest.skip(str(e))
    machine_run(family, factory, "vllm", examples=10, seed=7, shrink_seconds=30)
