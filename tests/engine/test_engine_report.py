"""An engine finding's report (harness/traces/report.py) says where in the engine, which workload, and
the engine's last manager calls; the headline speaks of the engine's cache, not of kvspec's oracle."""

from __future__ import annotations

from kvspec.harness.check.finding import Finding
from kvspec.harness.engine.workload import draw_workload
from kvspec.harness.traces.report import render_report
from kvspec.harness.traces.trace import Trace
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.types import BlockCount, TokenCount


def test_an_engine_kv_finding_reads_in_the_engines_terms() -> None:
    calls = [{"op": "get_computed_blocks", "request_id": "r1", "outcome": {"block_ids": [[]], "num_hit_tokens": 0}}]
    finding = Finding(
        "kv-mismatch",
        None,
        "request r1: K of layer 0 at position 37 (block 2, slot 5) differs",
        witness={"manager_calls": 9, "last_1_manager_calls": calls},
    )
    workload = draw_workload("block_boundaries", 4)
    trace = Trace(
        config=KVCacheConfig(BlockCount(16), (full_attention(32),), TokenCount(256)),
        steps=[],
        target_name="vllm-engine",
        target_version="vllm 0.32.0",
        family=workload.family,
        seed=workload.seed,
        finding=finding.to_json(),
        extra={
            "driver": "vllm-engine",
            "workload": workload.to_json(),
            "model_kind": "hybrid",
            "prefix_caching": False,
            "check": "kv",
        },
    )
    text = render_report(trace)
    assert "The engine's paged KV cache holds numbers the reference model does not at the hybrid model" in text
    assert "- model: `hybrid`, prefix cache off, check: kv" in text
    assert text.count("- request: prompt of") == len(workload.requests)
    assert "### The engine's last 1 manager calls (of 9)" in text and '"op":"get_computed_blocks"' in text
