"""The opt-in ``slow`` marker of the CI-integration tests: tests marked ``slow`` (HypoFuzz for half a
minute, the whole mutant campaign) are skipped unless ``KVSPEC_SLOW=1``, so the default run stays short."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVSPEC_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set KVSPEC_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
