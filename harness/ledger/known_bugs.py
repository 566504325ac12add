"""Known bugs of the targets, as data: what each is, where it is reproduced, how to recognise it.

vLLM 0.33 has bugs the KV ledger (docs/semantics.md §11) reports, and the spec models 0.33 exactly,
bugs included (``impl`` refuses their inputs instead: impl/allocator/refusals.py; it shares none of
K1-K9, tests/impl/test_known_bugs_absent.py).  Rather than steering the workload away from their
triggers (which would hide those configs from every other check), a finding that matches a known bug
is counted, listed in the run summary and written once as a report; it does not fail the run unless
``--strict-known`` (``CheckSettings.strict_known``).  Any other finding still fails it.

A bug is recognised by its trigger predicate over the ledger finding's stable signature
(``harness.ledger.finding``): the broken rule, the group kind and sizes, where the position came
from, why it was recomputed and what separates the KV held from the KV needed; and only in the
releases it affects (``affected_releases``; a finding of a what-if profile, or one without a
release, matches whatever the releases).  docs/upstream/ has one report per bug, with the exact
condition (``kvspec prove``) and a reproduction on vLLM's real scheduler or manager.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kvspec.harness.ledger.finding import match_vllm_033_candidate
from kvspec.spec.releases.line import RELEASES, version_key


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
    invariants: tuple[str, ...] = ()  # recognised by one of these spec invariants breaking (not by the ledger)

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
        "vLLM 0.23.0-0.34.0 (spec: modelled; impl: refused at the admission)",
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
        "vLLM 0.23.0-0.34.0 (spec: modelled; impl: refused at the recompute)",
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
        "vLLM 0.23.0-0.34.0 (latent where the attention kernel uses the configured block size: its metadata "
        "builder asserts at the first forward pass; spec: modelled; impl: refused at construction)",
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


class NamedViolation(Protocol):
    """A broken invariant (of the spec's state, or of an observation): its name and message."""

    @property
    def name(self) -> str: ...

    @property
    def message(self) -> str: ...


V = TypeVar("V", bound=NamedViolation)


def _never(signature: dict[str, Any]) -> bool:
    """For a bug recognised by an invariant: no ledger finding shows it."""
    return False


KNOWN_BUGS += (
    KnownBug(
        "K7",
        "hybrid_second_full_group_untrimmed",
        "a hybrid lookup cuts only the first full-attention group to the final hit; a second one keeps "
        "blocks past it, adopted and then recomputed into",
        "vLLM 0.23.0-0.28.0 (spec: modelled by their profiles, hybrid_hit_trim = 'first_group')",
        "fixed in 0.29.0",
        "tests/spec/releases/test_release_bugs_caught.py",
        "docs/releases.md",
        _never,
        "coordinator: spec/coordinator.py (the 0.29.0 trim: profile_for('0.29.0'))",
        releases_before("0.29.0"),
        "0.29.0",
        invariants=("lookup_is_pure_and_bounded",),
    ),
    KnownBug(
        "K8",
        "external_blocks_take_another_groups_hit",
        "admission lets one group's external-token blocks pop a later group's untouched hit, so one "
        "block sits in two groups' tables (vLLM issue #33775)",
        "vLLM 0.23.0 (spec: modelled by its profile, external_allocation = 'per_group')",
        "fixed in 0.24.0",
        "tests/spec/releases/test_release_bugs_caught.py",
        "docs/releases.md",
        _never,
        "coordinator: spec/coordinator.py (the 0.24.0 order: profile_for('0.24.0'))",
        releases_before("0.24.0"),
        "0.24.0",
        # one block in two groups' tables, the later group's hit key evicted under it
        invariants=("one_group_per_block", "sharing_only_through_prefix", "hashed_means_full_and_correct"),
    ),
)


def _window_read_freed(signature: dict[str, Any]) -> bool:
    """A window position of a step still in flight, read or written in a block already freed (no
    recompute, no load): the in-flight step writes it, or a rolled-back one reads it again."""
    return (
        signature["invariant"] in ("kv_read_in_real_block", "kv_write_in_real_block")
        and signature["group_kind"] in ("sliding_window", "chunked_local")
        and signature["source"] == "computed"
        and signature["recompute"] is None
    )


KNOWN_BUGS += (
    KnownBug(
        "K9",
        "window_freed_on_computed_total",
        "window blocks are freed on the computed total, tokens of steps still in flight included, so a "
        "draft rejection rolls back into blocks already freed (async scheduling with drafts)",
        "vLLM 0.23.0-0.25.1 (spec: modelled by their profiles, window_free_basis = 'computed')",
        "fixed in 0.26.0",
        "tests/ledger/test_ledger_async_drafts.py",
        "docs/releases.md",
        _window_read_freed,
        "manager: spec/slot_allocation.py (the 0.26.0 basis: profile_for('0.26.0'))",
        releases_before("0.26.0"),
        "0.26.0",
    ),
)


def split_known(violations: list[V], release: str | None, muted: set[str]) -> tuple[list[V], list[tuple[KnownBug, V]]]:
    """``violations`` (each with a ``name``: the invariant) split into those no known bug explains
    and those of a bug recorded for ``release`` whose invariant they break (by design of that
    release).  A bug's invariant is muted after its first break: the state it leaves no longer
    meets it.  The same break in a release the bug is not recorded for is a finding."""
    unknown: list[V] = []
    known: list[tuple[KnownBug, V]] = []
    for v in violations:
        name = v.name
        if name in muted:
            continue
        bug = next((b for b in KNOWN_BUGS if name in b.invariants and release in b.affected_releases), None)
        if bug is None:
            unknown.append(v)
        else:
            muted.add(name)
            known.append((bug, v))
    return unknown, known


def match_known_bug(signature: dict[str, Any]) -> KnownBug | None:
    """The known bug a ledger finding's signature shows, in a release it affects, or None."""
    release = signature.get("release")
    return next((b for b in KNOWN_BUGS if b.affects(release) and b.trigger(signature)), None)


def get_known_bug(bug_id: str) -> KnownBug:
    return next(b for b in KNOWN_BUGS if b.id == bug_id)


_ACCESS = re.compile(
    r"Request (?P<rid>\S+): token (?P<token>\d+) (?P<verb>reads|writes|publishes) position (?P<pos>\d+) in "
    r"(?P<where>the null block|block \d+) \(group (?P<group>\d+)\)(?:; needs (?P<needs>.+?), holds (?P<holds>.+))?$"
)
_GROUP = re.compile(r"^(?:known bug \S+ \([^)]*\): )?\w+: (?P<kind>\w+)\((?P<params>[^)]*)\)")


def describe_meeting(bug: KnownBug, message: str) -> str:
    """The first paragraph of a known bug's report, in vLLM's terms: what the bug is, which request
    read or wrote which position in which block here, what that does, and where the write-up is
    (``message``: the ledger finding's summary; a message of another shape gets the bug alone)."""
    head = f"**What went wrong.** Known bug {bug.id}, in {_for_vllm(bug.affected)}: {bug.title}."
    tail = f"The write-up gives the conditions, a reproduction on vLLM's own code and a fix: {bug.report}."
    access, group = _ACCESS.search(message), _GROUP.search(message)
    if access is None or group is None:
        return f"{head} {tail}"
    a = access.groupdict()
    block = "the null block (block 0)" if a["where"] == "the null block" else a["where"]
    where = f"{block} of group {a['group']} ({group['kind'].replace('_', ' ')}, {group['params']})"
    if a["verb"] == "reads":
        what = (
            f"Here request `{a['rid']}`, computing token {a['token']}, reads position {a['pos']} from {where}, "
            f"where its attention needs the KV written for that position; it finds {_held(a['holds'])}, "
            "so the token is computed from KV that is not its own."
        )
    elif a["verb"] == "writes":
        what = (
            f"Here request `{a['rid']}`, computing token {a['token']}, writes the KV of position {a['pos']} into "
            f"{where}: that KV is lost, and the position's later reads get something else."
        )
    else:
        what = (
            f"Here request `{a['rid']}` publishes position {a['pos']} in {where} for reuse before its KV is "
            "written: another request's prefix hit would read it."
        )
    return f"{head} {what} {tail}"


def _for_vllm(affected: str) -> str:
    """``affected`` without what it says of kvspec's own targets (``spec:``, ``impl:``)."""
    head, _, notes = affected.partition(" (")
    kept = [n for n in notes.rstrip(")").split("; ") if n and not n.startswith(("spec:", "impl:"))]
    return f"{head} ({'; '.join(kept)})" if kept else head


def _held(holds: str | None) -> str:
    if holds in (None, "unwritten"):
        return "nothing written there"
    return f"the KV of {holds}"
