"""The two test tiers.

- The default tier, ``bash ci/test`` (what CI runs, ``.ci/run``): every module, every invariant's
  deliberate bug, the corpus on every target and real vLLM, within 10 minutes on 2 cores.
- The full tier, ``bash ci/test --full`` (``KVSPEC_FULL=1``; the nightly job): the default tier plus
  the tests and parameters marked ``full`` (HypoFuzz, the whole mutant campaign, every family's
  coverage, the slowest mutants under glimpses) and the longer budgets of the ``full_tier`` fixture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

# Triton chooses its interpreter once, when it is first imported, and vLLM imports it too: the
# choice is made here, before any test module runs, so tests/impl/test_triton_interpreter.py gets
# the interpreter whichever module a worker ran first.  (With CUDA the compiled kernel is tested.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under GitHub Actions every ``kvspec fuzz`` would annotate the job and write to its step summary
# (harness/run/ci_output.py): the tests' own runs must not, so the variables go for the whole session,
# subprocesses included; tests/harness/test_ci_output.py sets them where it checks that output.
for _name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
    os.environ.pop(_name, None)


def is_full_tier() -> bool:
    return os.environ.get("KVSPEC_FULL") == "1"


@pytest.fixture
def full_tier() -> bool:
    """Whether this is the full tier (tests then use their longer budgets)."""
    return is_full_tier()


def vllm_installed() -> bool:
    """Is vLLM importable here (looked up, not imported)?"""
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``vllm`` skip where vLLM is not installed; tests marked ``full`` skip outside the
    full tier."""
    no_vllm = pytest.mark.skip(reason="needs the real vLLM installed (ci/setup --vllm)")
    if not vllm_installed():
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(no_vllm)
    if is_full_tier():
        return
    skip = pytest.mark.skip(reason="full tier: bash ci/test --full (KVSPEC_FULL=1) runs it")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


class MachineRun:
    """The ``machine_run`` fixture: kvspec's state machine of one family run for a few seeded examples,
    the one place tests build and run it (``harness.check.machine``)."""

    def __call__(
        self,
        family: str,
        factory: Any,
        target: str = "spec",
        *,
        examples: int | None = 15,
        seed: int = 2024,
        shrink_seconds: int = 20,
        profile: str = "dev",
        checks: Any = None,
        expect: str = "clean",
    ) -> Any:
        """The run's ``RunStats``.  ``expect``: ``clean`` (a finding fails the test, naming it),
        ``finding`` (the run must end in one; the test fails if it does not), or ``any``.
        ``examples`` None: the profile's own number."""
        from kvspec.harness.check.machine import RunStats, make_machine, run_machine
        from kvspec.harness.check.settings import CheckSettings
        from kvspec.harness.run.profiles import profile_settings

        stats = RunStats()
        cls = make_machine(family, factory, target, checks or CheckSettings(), stats)
        budget = {} if examples is None else {"max_examples": examples}
        hyp = profile_settings(profile, database=None, **budget)
        try:
            run_machine(cls, hyp, seed=seed, shrink_seconds=shrink_seconds)
        except Exception:
            if expect == "clean":
                pytest.fail(stats.finding.summary() if stats.finding else "the machine raised without a finding")
            if expect == "finding" and stats.finding is None:
                raise
            return stats
        if expect == "finding":
            pytest.fail(f"{target} on {family}: no finding in {stats.examples} examples")
        return stats


@pytest.fixture
def machine_run() -> MachineRun:
    return MachineRun()
