"""The oracle around the real vLLM 0.33 ``KVCacheManager`` (skipped when vLLM is not installed)."""

from __future__ import annotations

import pytest
from configs_oracle import FAMILIES
from oracle_drive import drive
from test_oracle_findings import CHUNKED, CHUNKED_OPS, SWA, SWA_OPS, replay

from kvspec.harness.oracle.target import KVCheckTarget

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_factory():
    try:
        from kvspec.harness.targets.vllm import VllmTarget, VllmUnavailable
    except ImportError as e:  # pragma: no cover
        pytest.skip(f"kvspec.harness.targets.vllm unavailable: {e}")
    try:
        VllmTarget()
    except VllmUnavailable as e:
        pytest.skip(str(e))
    return VllmTarget


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_vllm_manager_passes_the_oracle(vllm_factory, family):
    target = KVCheckTarget(vllm_factory(), device="cpu")
    for seed in range(2):
        r = drive(target, FAMILIES[family][0], seed, 150)
        assert r.finding is None, r.finding.to_markdown()
        assert r.stopped is None, r.stopped
    assert target.stats.model_runs > 40


def test_vllm_shows_the_same_candidate_findings(vllm_factory):
    _, f = replay(vllm_factory(), CHUNKED, CHUNKED_OPS)
    assert 4 in f.positions and [b.block_id for b in f.bad_kv] == [0]
    _, f = replay(vllm_factory(), SWA, SWA_OPS)
    assert any(b.block_id == 0 for b in f.bad_kv)
