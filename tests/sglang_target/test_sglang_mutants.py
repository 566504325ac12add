"""Each deliberate bug in SGLang's radix cache (harness/mutants/sglang.py) is caught by the check
written for it, and the same seeds run clean on SGLang as it ships."""

from __future__ import annotations

import pytest
from sglang_cases import fuzz, needs_sglang

from kvspec.harness.mutants.sglang import MUTANTS, make_mutant_target

SEEDS = 3
EXAMPLES = 40
DEFAULT_TIER = ("sglang_lock_wrong_node",)
"""SGLang's policy caught on the real cache; the full tier runs all (and the window mutant is caught
in every tier by tests/sglang_target/test_sglang_target.py's window case)."""


def tiered(names: list[str]) -> list[object]:
    return [n if n in DEFAULT_TIER else pytest.param(n, marks=pytest.mark.full) for n in names]


@needs_sglang
@pytest.mark.mutant
@pytest.mark.parametrize("mutant", tiered(sorted(MUTANTS)))
def test_each_sglang_mutant_is_caught_by_its_intended_check(mutant: str) -> None:
    m = MUTANTS[mutant]
    for seed in range(SEEDS):
        stats = fuzz(lambda: make_mutant_target(mutant), m.family, seed, EXAMPLES)
        if stats.finding is not None:
            break
    else:
        pytest.fail(f"{mutant}: not caught in {SEEDS} runs of {EXAMPLES} examples")
    f = stats.finding
    assert f.invariant == m.intended, f"{mutant}: caught by {f.kind} {f.invariant}: {f.message}"
