"""Operation builders shared by the release tests."""

from __future__ import annotations

from typing import Any

from kvspec.harness.core import ops as O


def tokens(n: int, start: int = 1) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def admit(rid: str, prompt: tuple[int, ...]) -> list[Any]:
    """A request arrives, looks up the prefix cache and allocates its whole prompt."""
    return [
        O.AddRequest(rid, prompt),
        O.GetComputedBlocks(rid),
        O.AllocateSlots(rid, len(prompt), use_computed_blocks=True),
    ]


def running(rid: str, num_computed_tokens: int) -> list[Any]:
    """The scheduler marks the request running with ``num_computed_tokens`` computed."""
    return [O.SetStatus(rid, "RUNNING"), O.SetNumComputedTokens(rid, num_computed_tokens)]
