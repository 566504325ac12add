"""Known bugs of the targets, as data: what each is, where it is reproduced, how to recognise it.

vLLM 0.33 has bugs the KV ledger (docs/semantics.md §11) reports, and the spec and ``impl`` model
0.33 exactly, bugs included.  Rather than steering the workload away from their triggers (which
would hide those configs from every other check), a finding that matches a known bug is counted,
listed in the run summary and written once as a report; it does not fail the run unless
``--strict-known`` (``KVSPEC_STRICT_KNOWN=1``).  Any other finding still fails it.

A bug is recognised by its trigger predicate over the ledger finding's stable signature
(``harness.ledger.finding``): the broken rule, the group kind and sizes, where the position came
from, why it was recomputed and what separates the KV held from the KV needed; and only in the
releases it affects (``affected_releases``; a finding of a what-if profile, or one without a
release, matches whatever the releases).  docs/upstream/ has one report per bug, with the exact
condition (``kvspec prove``) and a reproduction on vLLM's real scheduler or manager.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.ledger.finding import match_vllm_033_candidate
from spec.releases.line import RELEASES, version_key


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
    affected_releases: tuple[str, ...] = ()  # the releases that have it (empty: not recorded)
    fixed_in: str | None = None  # the first release without it (None: not fixed)

    def affects(self, release: str | None) -> bool:
        """The bug is in ``release`` (None, or no releases recorded: assume so)."""
        return release is None or not self.affected_releases or release in self.affected_releases


def releases_before(fixed_in: str, first: str = RELEASES[0]) -> tuple[str, ...]:
    """The modelled releases from ``first`` up to the one before ``fixed_in``."""
    return tuple(r for r in RELEASES if version_key(first) <= version_key(r) < version_key(fixed_in))


def _candidate(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda signature: match_vllm_033_candidate(signature) == name


def _reused(differs: str) -> Callable[[dict[str, Any]], bool]:
    """A token reads, through a prefix hit, a block whose KV was computed for another context."""
    return lambda s: s["invariant"] == "kv_read_own_kv" and s["source"] == "prefix-hit" and s.get("differs") == differs


K1_K3_RELEASES = RELEASES  # measured on every release 0.23.0-0.34.0 (docs/upstream; tests/upstream LAST_AFFECTED)


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(
        "K1",
        "window_full_remote_load",
        "a whole-prompt remote load under a window recomputes the last token through the null block",
        "vLLM 0.23.0-0.34.0 (spec, impl: modelled)",
        "unreported",
        "tests/upstream/test_full_remote_load_window.py",
        "docs/upstream/full-remote-load-window.md",
        _candidate("window_full_remote_load"),
        "manager: harness/mutants/fixes_vllm.py (--target vllm-fixed)",
        K1_K3_RELEASES,
    ),
    KnownBug(
        "K2",
        "window_invalid_block_recovery",
        "invalid-block recovery under a sliding window recomputes from positions whose blocks were dropped",
        "vLLM 0.23.0-0.34.0 (spec, impl: modelled)",
        "unreported",
        "tests/upstream/test_invalid_block_recovery_window.py",
        "docs/upstream/invalid-block-recovery-window.md",
        _candidate("window_invalid_block_recovery"),
        "scheduler: tests/upstream/test_invalid_block_recovery_window.py (real Scheduler)",
        K1_K3_RELEASES,
    ),
    KnownBug(
        "K3",
        "chunk_not_block_multiple",
        "chunked local attention with a chunk that is not a block multiple counts nulls as a hit",
        "vLLM 0.23.0-0.34.0 (latent: the attention backend asserts at the first forward pass)",
        "unreported",
        "tests/upstream/test_chunked_local_chunk_not_block_multiple.py",
        "docs/upstream/chunked-local-chunk-not-block-multiple.md",
        _candidate("chunk_not_block_multiple"),
        "start-up check: harness/mutants/fixes_vllm.py (--target vllm-fixed)",
        K1_K3_RELEASES,
    ),
    KnownBug(
        "K4",
        "lora_name_only_key",
        "two LoRA adapters with one name and different paths share cached blocks",
        "vLLM 0.23.0-0.30.0 (spec: modelled by their profiles, extra_key_form = 'bare')",
        "fixed in 0.31.0",
        "tests/upstream/test_request_key_collisions.py",
        "docs/upstream/request-key-collisions.md",
        _reused("lora-path"),
        "hashing: spec/hashing.py (the 0.31.0 keys: profile_for('0.31.0'))",
        releases_before("0.31.0"),
        "0.31.0",
    ),
    KnownBug(
        "K5",
        "mm_keys_missing_after_creation",
        "a block completed by output tokens is keyed only on the last image, so requests differing in "
        "an earlier image of it share it",
        "vLLM 0.23.0-0.30.0 (spec: modelled by their profiles, mm_resume_scan = 'last_item')",
        "fixed in 0.31.0",
        "tests/upstream/test_request_key_collisions.py",
        "docs/upstream/request-key-collisions.md",
        _reused("mm"),
        "hashing: spec/hashing.py (the 0.31.0 keys: profile_for('0.31.0'))",
        releases_before("0.31.0"),
        "0.31.0",
    ),
    KnownBug(
        "K6",
        "untagged_extra_keys",
        "a LoRA request and a salted request whose salt equals the adapter's name share their first block",
        "vLLM 0.23.0-0.30.0 (spec: modelled by their profiles, extra_key_form = 'bare')",
        "fixed in 0.31.0",
        "tests/upstream/test_request_key_collisions.py",
        "docs/upstream/request-key-collisions.md",
        _reused("lora"),
        "hashing: spec/hashing.py (the 0.31.0 keys: profile_for('0.31.0'))",
        releases_before("0.31.0"),
        "0.31.0",
    ),
)


def strict_known() -> bool:
    """Known bugs fail the run too (``--strict-known`` sets ``KVSPEC_STRICT_KNOWN=1``)."""
    return os.environ.get("KVSPEC_STRICT_KNOWN", "0") == "1"


def match_known_bug(signature: dict[str, Any]) -> KnownBug | None:
    """The known bug a ledger finding's signature shows, in a release it affects, or None."""
    release = signature.get("release")
    return next((b for b in KNOWN_BUGS if b.affects(release) and b.trigger(signature)), None)


def get_known_bug(bug_id: str) -> KnownBug:
    return next(b for b in KNOWN_BUGS if b.id == bug_id)
