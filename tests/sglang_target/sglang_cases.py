"""What the SGLang tests share: whether SGLang is there, and runs of the one machine on a target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

from kvspec.harness.check.machine import RunStats, make_machine, run_machine
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.sglang.load import SglangUnavailable, load_sglang


def sglang_there() -> bool:
    try:
        load_sglang()
    except SglangUnavailable:
        return False
    return True


needs_sglang = pytest.mark.skipif(not sglang_there(), reason="SGLang is not there (bash ci/setup --sglang)")


def fuzz(factory: Callable[[], Any], family: str, seed: int, examples: int) -> RunStats:
    """``examples`` examples of ``family`` on the target ``factory`` builds, invariants relation, the
    KV ledger on; the run's stats (``finding`` set when one was found, not shrunk)."""
    stats = RunStats()
    machine = make_machine(family, factory, "sglang-test", CheckSettings(relation="invariants"), stats)
    try:
        run_machine(machine, settings(max_examples=examples, deadline=None, database=None), seed=seed, shrink_seconds=1)
    except Exception:  # noqa: BLE001 - the finding is in the stats; anything else is checked by the caller
        if stats.finding is None:
            raise
    return stats
