"""Known bugs of the targets, as data: what each is, where it is reproduced, how to recognise it.

vLLM 0.33 has bugs the KV ledger (docs/semantics.md §11) reports, and the spec and ``impl`` model
0.33 exactly, bugs included.  Rather than steering the workload away from their triggers (which
would hide those configs from every other check), a finding that matches a known bug is counted,
listed in the run summary and written once as a report; it does not fail the run unless
``--strict-known`` (``KVSPEC_STRICT_KNOWN=1``).  Any other finding still fails it.

A bug is recognised by its trigger predicate over the ledger finding's stable signature
(``harness.ledger.finding``): the broken rule, the group kind and sizes, where the position came
from and why it was recomputed.  docs/upstream/ has one report per bug, with the exact condition
(``kvspec prove``) and a reproduction on vLLM's real scheduler.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.ledger.finding import match_vllm_033_candidate


@dataclass(frozen=True)
class KnownBug:
    id: str
    name: str
    title: str
    affected: str  # versions of vLLM, and which kvspec targets model it
    status: str  # unreported | reported (link) | fixed in X
    reproduction: str  # the standalone reproduction in this repo
    report: str  # the upstream-ready report in this repo
    trigger: Callable[[dict[str, Any]], bool]  # over a ledger finding's signature
    fix: str  # where the proposed fix is applied at run time


def _candidate(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda signature: match_vllm_033_candidate(signature) == name


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        "K1",
        "window_full_remote_load",
        "a whole-prompt remote load under a window recomputes the last token through the null block",
        "vLLM 0.33.0 (spec, impl: modelled)",
        "unreported",
        "tests/upstream/test_full_remote_load_window.py",
        "docs/upstream/full-remote-load-window.md",
        _candidate("window_full_remote_load"),
        "manager: harness/mutants/fixes_vllm.py (--target vllm-fixed)",
    ),
    KnownBug(
        "K2",
        "window_invalid_block_recovery",
        "invalid-block recovery under a sliding window recomputes from positions whose blocks were dropped",
        "vLLM 0.33.0 (spec, impl: modelled)",
        "unreported",
        "tests/upstream/test_invalid_block_recovery_window.py",
        "docs/upstream/invalid-block-recovery-window.md",
        _candidate("window_invalid_block_recovery"),
        "scheduler: tests/upstream/test_invalid_block_recovery_window.py (real Scheduler)",
    ),
    KnownBug(
        "K3",
        "chunk_not_block_multiple",
        "chunked local attention with a chunk that is not a block multiple counts nulls as a hit",
        "vLLM 0.33.0 (latent: the attention backend asserts at the first forward pass)",
        "unreported",
        "tests/upstream/test_chunked_local_chunk_not_block_multiple.py",
        "docs/upstream/chunked-local-chunk-not-block-multiple.md",
        _candidate("chunk_not_block_multiple"),
        "start-up check: harness/mutants/fixes_vllm.py (--target vllm-fixed)",
    ),
)


def strict_known() -> bool:
    """Known bugs fail the run too (``--strict-known`` sets ``KVSPEC_STRICT_KNOWN=1``)."""
    return os.environ.get("KVSPEC_STRICT_KNOWN", "0") == "1"


def match_known_bug(signature: dict[str, Any]) -> KnownBug | None:
    """The known bug a ledger finding's signature shows, or None."""
    return next((b for b in KNOWN_BUGS if b.trigger(signature)), None)


def get_known_bug(bug_id: str) -> KnownBug:
    return next(b for b in KNOWN_BUGS if b.id == bug_id)
