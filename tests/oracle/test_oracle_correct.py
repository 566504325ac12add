"""The KV-content oracle passes on correct managers, and it really checks something.

A correct manager (kvspec's ``impl`` allocator, the spec itself) must never produce a KV mismatch
on the seeded workload (``harness.world.workload.run_seeded``: same-step hits, async P/D loads and load
failures, drafts and pad_spec_decode, preemption) in every decoder family; the stats show that
model runs, prefix-hit checks, connector loads and poisoning all happened on the way.
"""

from __future__ import annotations

import json

import pytest
import torch
from configs_oracle import ALL, FAMILIES
from oracle_drive import drive

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.oracle.target import KVCheckTarget, dense_reference
from kvspec.harness.targets.base import Target, Unsupported
from kvspec.harness.targets.impl import ImplTarget
from kvspec.harness.targets.spec import SpecTarget
from kvspec.impl.paged.model import LayerSpec, ModelConfig, TinyTransformer
from kvspec.spec.config import KVCacheConfig, cross_attention, full_attention

ACTIONS = 200


def test_dense_reference_is_forward_dense():
    """The K/V-keeping reference gives forward_dense's hidden states (and K/V that matter)."""
    cfg = ModelConfig(vocab_size=320, layers=(LayerSpec("full"), LayerSpec("sliding_window", 3), LayerSpec("full")))
    m = TinyTransformer(cfg, device="cpu")
    tokens = [5, 17, 300, 2, 2, 9, 41, 63, 100, 7]
    d = dense_reference(m, tokens)
    torch.testing.assert_close(d.hidden, m.forward_dense(tokens), rtol=0, atol=0)
    other = dense_reference(m, [6] + tokens[1:])
    assert not torch.allclose(d.k[2][9], other.k[2][9])  # layer-2 K of the last token depends on token 0


@pytest.mark.parametrize("name, config", ALL, ids=[n for n, _ in ALL])
def test_impl_passes_the_workload(name, config):
    """Seeds 0-2 (seed 1 runs the KV connector).  Where a run reaches one of the known vLLM 0.33
    wrong-number paths (test_oracle_findings.py), impl refuses the input (impl/allocator/refusals.py)
    and the run stops there; the oracle never meets the bug (``stats.known_bugs`` stays empty)."""
    target = KVCheckTarget(ImplTarget(), device="cpu")
    for seed in range(3):
        r = drive(target, config, seed, ACTIONS)
        assert r.finding is None, r.finding.to_markdown()
        assert r.stopped is None or r.stopped.startswith("unsupported: impl refuses K"), r.stopped
    assert not target.stats.known_bugs
    s = target.stats
    totals = dict(
        runs=s.model_runs, hits=s.hit_tokens_checked, ext=s.external_tokens_written, poisoned=s.blocks_poisoned
    )
    assert totals["runs"] > 150 and totals["poisoned"] > 0 and totals["ext"] > 0 and totals["hits"] > 0, totals


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_spec_passes_the_workload(family):
    config = FAMILIES[family][0]
    target = KVCheckTarget(SpecTarget(), device="cpu")
    for seed in range(2):
        r = drive(target, config, seed, ACTIONS)
        assert r.finding is None, r.finding.to_markdown()
        assert r.stopped is None, r.stopped
    assert target.stats.model_runs > 100


class Tee:
    """Applies every operation to ``plain`` and ``wrapped`` and checks they agree, returning the
    wrapped outcome (the workload reads tables through ``observe``: the wrapped one's)."""

    name = "tee"
    version = "test"

    def __init__(self, plain: Target, wrapped: KVCheckTarget) -> None:
        self.plain, self.wrapped = plain, wrapped

    def reset(self, config: KVCacheConfig) -> None:
        self.plain.reset(config)
        self.wrapped.reset(config)

    def apply(self, op: O.Op) -> object:
        a, b = self.plain.apply(op), self.wrapped.apply(op)
        assert a == b, op
        assert self.plain.observe() == self.wrapped.observe(), op
        return b

    def observe(self) -> Observation:
        return self.wrapped.observe()


def test_outcomes_and_observations_pass_through():
    """The wrapper returns the inner outcomes unchanged and observes the inner target."""
    config = FAMILIES["hybrid_equal"][0]
    wrapped = KVCheckTarget(ImplTarget(), device="cpu")
    r = drive(Tee(ImplTarget(), wrapped), config, 1, 150)
    assert r.finding is None and r.stopped is None, r
    assert wrapped.stats.ops > 100 and wrapped.stats.external_tokens_written > 0
    assert wrapped.name == "kv-check(impl)" and "oracle" in wrapped.version


def test_cross_attention_groups_are_skipped_not_checked():
    config = KVCacheConfig(30, (full_attention(4), cross_attention(4)), 100, enable_caching=False)
    target = KVCheckTarget(ImplTarget(), device="cpu")
    r = drive(target, config, 0, ACTIONS)
    assert r.finding is None and r.stopped is None
    assert target.stats.model_runs > 20
    assert all(layer.group == 0 for layer in target.model.config.layers)
    with pytest.raises(Unsupported):
        target.reset(KVCacheConfig(30, (cross_attention(4),), 100, enable_caching=False))


def test_lora_and_multimodal_change_the_numbers():
    """Requests with the same tokens under another adapter / image must not share KV."""
    config = FAMILIES["full"][0]
    t = KVCheckTarget(ImplTarget(), device="cpu")
    t.reset(config)
    toks = tuple(range(8))
    t.apply(O.AddRequest("plain", toks))
    t.apply(O.AddRequest("lora", toks, lora=("sql", "/l")))
    t.apply(O.AddRequest("mm", toks, mm_features=(O.MMFeatureSpec("img", 2, 3),)))
    seqs = [t.book.get_native(r).virtual(toks) for r in ("plain", "lora", "mm")]
    assert len(set(seqs)) == 3 and seqs[0][:2] == seqs[2][:2] and seqs[0][5:] == seqs[2][5:]


def test_finding_renders_as_json_and_markdown():
    from kvspec.harness.mutants.impl import make_mutant_target

    config = FAMILIES["sliding_window"][0]
    r = drive(KVCheckTarget(make_mutant_target("window_off_by_one"), device="cpu"), config, 0, ACTIONS)
    assert r.finding is not None
    j = r.finding.to_json()
    json.dumps(j, allow_nan=False)  # strict JSON: NaN errors are written as strings
    assert j["request_id"] and j["positions"] and j["block_ids"] is not None
    md = r.finding.to_markdown()
    assert md.startswith("## KV contents") and r.finding.request_id in md


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CI has no GPU)")
def test_oracle_on_cuda():  # pragma: no cover - GPU only
    for _name, config in ALL[:3]:
        target = KVCheckTarget(ImplTarget(), device="cuda")
        r = drive(target, config, 0, ACTIONS)
        assert r.finding is None, r.finding.to_markdown()
