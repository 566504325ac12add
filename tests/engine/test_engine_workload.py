"""Engine workloads (harness/engine/workload.py): drawn from a family and a seed alone, within the
tiny models' limits, each family showing what it is for, and refused when malformed (a workload in a
report is data)."""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.harness.engine.models import BLOCK_SIZE, MAX_MODEL_LEN, VOCAB
from kvspec.harness.engine.workload import ENGINE_FAMILIES, EngineWorkload, draw_workload

SEEDS = range(40)


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_a_family_and_a_seed_are_the_whole_workload(family: str) -> None:
    for seed in SEEDS:
        w = draw_workload(family, seed)
        assert w == draw_workload(family, seed)
        assert EngineWorkload.from_json(w.to_json(), "round trip") == w
        for r in w.requests:
            assert len(r.prompt) + r.max_tokens <= MAX_MODEL_LEN and r.max_tokens >= 1
            assert all(0 < t < VOCAB for t in r.prompt)
    assert len({draw_workload(family, s) for s in SEEDS}) == len(SEEDS)


def test_each_family_draws_what_it_is_for() -> None:
    def every(family: str) -> list[Any]:
        return [r for s in SEEDS for r in draw_workload(family, s).requests]

    assert sum(r.abort_step is not None for r in every("aborts")) >= 20
    assert sum(r.n > 1 for r in every("parallel_sampling")) >= 20
    assert sum(r.prompt_logprobs for r in every("prompt_logprobs")) >= 20
    lengths = [len(r.prompt) for r in every("block_boundaries")]
    assert all(n % BLOCK_SIZE in (BLOCK_SIZE - 1, 0, 1) or n == 1 for n in lengths)
    # preemption: more KV than a 16-block pool holds, in most workloads
    over = [
        sum(len(r.prompt) + r.max_tokens for r in draw_workload("preemption", s).requests) > 16 * BLOCK_SIZE
        for s in SEEDS
    ]
    assert sum(over) >= 35
    # shared prefixes: some prompt pair shares at least a block
    shared = 0
    for s in SEEDS:
        ps = [r.prompt for r in draw_workload("shared_prefix", s).requests]
        shared += any(
            a[:BLOCK_SIZE] == b[:BLOCK_SIZE] and len(a) >= BLOCK_SIZE for i, a in enumerate(ps) for b in ps[i + 1 :]
        )
    assert shared >= 20


def _good() -> dict[str, Any]:
    return draw_workload("aborts", 3).to_json()


BAD = [
    (lambda w: w.update(family="nope"), "family must be one of"),
    (lambda w: w.update(seed=-1), "seed must be"),
    (lambda w: w.update(requests=[]), "requests must be a list"),
    (lambda w: w["requests"][0].update(prompt=[]), "requests[0].prompt"),
    (lambda w: w["requests"][0].update(prompt=[VOCAB]), "requests[0].prompt"),
    (lambda w: w["requests"][0].update(prompt=["1"]), "requests[0].prompt"),
    (lambda w: w["requests"][0].update(max_tokens=MAX_MODEL_LEN), "max_tokens"),
    (lambda w: w["requests"][0].update(n=9), "requests[0].n"),
    (lambda w: w["requests"][0].update(arrive_step=5, abort_step=4), "abort_step"),
    (lambda w: w["requests"][0].update(code="os.system"), "unknown fields"),
]


@pytest.mark.parametrize("spoil, message", BAD)
def test_a_malformed_workload_is_refused_by_name(spoil: Any, message: str) -> None:
    w = _good()
    spoil(w)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        EngineWorkload.from_json(w, "report")
