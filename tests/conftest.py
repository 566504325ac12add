"""The two test tiers.

- The default tier, ``bash ci/test`` (what CI runs, ``.ci/run``): every module, every invariant's
  deliberate bug, the corpus on every target and real vLLM, within 10 minutes on 2 cores.
- The full tier, ``bash ci/test --full`` (``KVSPEC_FULL=1``; the nightly job): the default tier plus
  the tests and parameters marked ``full`` (HypoFuzz, the whole mutant campaign, every family's
  coverage, the slowest mutants under glimpses) and the longer budgets of the ``full_tier`` fixture.
"""

from __future__ import annotations

import os

import pytest
import torch

# Triton chooses its interpreter once, when it is first imported, and vLLM imports it too: the
# choice is made here, before any test module runs, so tests/impl/test_triton_interpreter.py gets
# the interpreter whichever module a worker ran first.  (With CUDA the compiled kernel is tested.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def is_full_tier() -> bool:
    return os.environ.get("KVSPEC_FULL") == "1"


@pytest.fixture
def full_tier() -> bool:
    """Whether this is the full tier (tests then use their longer budgets)."""
    return is_full_tier()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if is_full_tier():
        return
    skip = pytest.mark.skip(reason="full tier: bash ci/test --full (KVSPEC_FULL=1) runs it")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)
