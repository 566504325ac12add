"""Counterexamples as files: a JSON report per failed claim, with a replayable trace when the
claim has one.

The trace is a ``harness.traces.trace.Trace`` (schema version 1) built from the operation vocabulary of
``harness.core.ops``; its ``finding`` names the claim and the failed goal.  The expected outcome of each
step is recorded by running the spec when ``harness.targets.spec`` is available, else left null
(replay then reports what the target does).  Writing goes through ``write_report`` only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvspec.harness.core.ops import (
    AddRequest,
    AllocateSlots,
    Free,
    GetComputedBlocks,
    Op,
    SetNumComputedTokens,
    SetSpecTokens,
)
from kvspec.harness.traces.trace import Trace, dumps_trace
from kvspec.spec.config import AttentionSpec, KVCacheConfig, chunked_local, full_attention, sliding_window
from kvspec.spec.types import BlockCount, TokenCount

REPORT_VERSION = 1


def group_spec(kind: str, block_size: int, span: int | None = None) -> AttentionSpec:
    if kind == "sliding_window":
        return sliding_window(block_size, span or 1)
    if kind == "chunked_local":
        return chunked_local(block_size, span or 1)
    return full_attention(block_size)


def allocation_trace(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """Turn an ``allocate_slots`` counterexample (the symbolic inputs of ``harness.proofs.allocation``)
    into ``{"config": KVCacheConfig, "ops": [Op, ...]}``: a warm-up request caches the prompt so that the
    request under test hits ``hits`` blocks, then the request is looked up and allocated with the
    counterexample's counts.

    Returns None when the numbers are too large to replay (more than 4096 tokens)."""
    bs = int(model.get("bs", 1) or 1)
    M = int(model.get("M", 1) or 1)
    T = int(model.get("T", 1) or 1)
    if M > 4096 or T > 4096 or bs < 1:
        return None
    kind = str(model.get("kind", "full"))
    span = int(model.get("span", 1) or 1)
    hits, e, n, la, c = (int(model.get(k, 0) or 0) for k in ("hits", "e", "n", "la", "c"))
    prompt = tuple(range(1, T + 1))
    steps: list[Any] = []
    if hits > 0:
        steps += [
            AddRequest("warm", prompt),
            AllocateSlots("warm", num_new_tokens=T),
            Free("warm"),
        ]
    steps.append(AddRequest("r", prompt))
    if model.get("path") == "running" and c > 0:
        steps += [AllocateSlots("r", num_new_tokens=c), SetNumComputedTokens("r", c)]
    else:
        steps.append(GetComputedBlocks("r"))
    drafts = n - (T - c - hits * bs - e)
    if drafts > 0:  # tokens scheduled beyond the request's own are unverified drafts
        steps.append(SetSpecTokens("r", tuple(range(T + 1, T + 1 + drafts))))
    steps.append(
        AllocateSlots(
            "r",
            num_new_tokens=n,
            num_new_computed_tokens=hits * bs,
            use_computed_blocks=hits > 0,
            num_lookahead_tokens=la,
            num_external_computed_tokens=e,
        )
    )
    num_blocks = 2 * (-(-M // bs)) + 2
    config = KVCacheConfig(
        num_blocks=BlockCount(num_blocks), groups=(group_spec(kind, bs, span),), max_model_len=TokenCount(M)
    )
    return {"config": config, "ops": steps}


def slot_targets_trace(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """``allocate_slots.slot_targets`` counterexamples in the shape ``allocation_trace`` reads
    (block size 1, the hit as ``new_comp`` blocks, num_tokens just large enough)."""
    c, nc, e, n = (int(model.get(k, 0) or 0) for k in ("c", "new_comp", "e", "n"))
    T = max(1, c + nc + e + 1)
    path = "running" if c > 0 else "admission"
    return allocation_trace({**model, "bs": 1, "hits": nc, "T": min(T, int(model.get("M", T))), "path": path})


def hit_cap_trace(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """``get_computed_blocks.hit_cap`` counterexamples: a warm-up request caches the prompt's full
    blocks, then the same prompt is looked up; the hit must stay below num_tokens."""
    T, bs = int(model.get("T", 1)), int(model.get("bs", 1))
    if T > 4096 or bs < 1:
        return None
    prompt = tuple(range(1, T + 1))
    ops: list[Op] = [
        AddRequest("warm", prompt),
        AllocateSlots("warm", num_new_tokens=T),
        Free("warm"),
        AddRequest("r", prompt),
        GetComputedBlocks("r"),
    ]
    config = KVCacheConfig(
        num_blocks=BlockCount(2 * (-(-T // bs)) + 2), groups=(full_attention(bs),), max_model_len=TokenCount(T)
    )
    return {"config": config, "ops": ops}


def _expected_outcomes(config: KVCacheConfig, ops: list[Op]) -> list[Any]:
    """The spec's outcome per step when a spec target exists; nulls otherwise (or if it fails)."""
    try:
        from kvspec.harness.targets import spec as spec_target

        target = spec_target.SpecTarget()
        target.reset(config)
        return [target.apply(op) for op in ops]
    except Exception:  # noqa: BLE001 - a counterexample may well make the spec raise
        return [None] * len(ops)


def make_trace(claim_name: str, outcome: Any, scenario: dict[str, Any]) -> Trace:
    ops = list(scenario["ops"])
    return Trace(
        config=scenario["config"],
        steps=list(zip(ops, _expected_outcomes(scenario["config"], ops))),
        target_name="spec",
        family="proof-counterexample",
        finding={
            "kind": "proof-counterexample",
            "step": len(ops) - 1,
            "message": f"kvspec prove {claim_name}: {outcome.goal}",
            "claim": claim_name,
            "model": {k: v for k, v in outcome.model.items() if isinstance(v, (int, str, bool))},
        },
    )


def write_report(out_dir: Path, claim_name: str, outcome: Any, scenario: dict[str, Any] | None) -> Path:
    """Write ``<out_dir>/<claim>/counterexample.json`` and, when the claim yields a scenario,
    ``<out_dir>/<claim>/trace.json`` (replayable); return the report folder."""
    folder = out_dir / claim_name.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "version": REPORT_VERSION,
        "claim": claim_name,
        "status": outcome.status,
        "goal": outcome.goal,
        "detail": outcome.detail,
        "model": dict(outcome.model),
    }
    if scenario is not None:
        (folder / "trace.json").write_text(dumps_trace(make_trace(claim_name, outcome, scenario)))
        report["trace"] = "trace.json"
    (folder / "counterexample.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return folder
