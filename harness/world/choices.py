"""Where the world's choices come from: ``Choices``, the one interface every driver draws through.

The Hypothesis state machine backs it with draws (``harness.check.machine``, so examples shrink), a
seeded run with a ``random.Random`` (``harness.world.workload.SeededChoices``); the scheduler model,
its KV-transfer side and the workload ask it every question the real scheduler leaves to the world.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Choices(Protocol):
    """Where the world's choices come from (Hypothesis draws, or a seeded RNG)."""

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        """An int in ``[lo, hi]``; with ``boundary``, often at or next to one of its multiples."""
        ...

    def boolean(self, label: str) -> bool: ...

    def token(self, label: str) -> int: ...

    def tokens(self, n: int, label: str) -> tuple[int, ...]: ...

    def choice(self, options: Sequence[T], label: str) -> T: ...
