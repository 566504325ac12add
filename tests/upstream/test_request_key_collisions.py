"""vLLM 0.23.0-0.30.0 block keys named less than the KV depends on (known bugs K4-K6, fixed in 0.31.0;
docs/upstream/request-key-collisions.md).  Three reproductions, each a short run of manager calls
with the model runs between them, judged by the KV ledger (docs/semantics.md §11), which knows what
each slot holds whatever the key says:

- K4 ``lora_name_only_key``: adapter "a" at /p1 computes 5 tokens; adapter "a" at /p2 with the same
  tokens hits the first block and reads KV computed with the other adapter's weights;
- K5 ``mm_keys_missing_after_creation``: r1's prompt ends in the unfinished block [8, 12) with images
  A (8) and B (9); an output token completes the block, which is keyed on B only; the next turn r2
  (r1's tokens, image B only) hits it and reads position 8 computed with image A;
- K6 ``untagged_extra_keys``: LoRA "sql" computes 5 tokens; a salted request (salt "sql", no
  adapter) hits the first block (both keyed ``("sql",)``) and reads KV computed with the adapter.

On the spec, each reproduction runs under the profile of every release kvspec models: a finding of
the bug in each release ``KnownBug.affected_releases`` names, clean from ``fixed_in`` on.  On the
installed vLLM (any release 0.23.0-0.34.0) the same holds for its own release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.ledger.checker import LedgerCheckTarget
from kvspec.harness.ledger.finding import LedgerFinding, LedgerMismatch
from kvspec.harness.ledger.known_bugs import get_known_bug, match_known_bug
from kvspec.harness.targets.base import bind_release
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import KVCacheConfig, full_attention
from kvspec.spec.releases.line import RELEASES, profile_for
from kvspec.spec.types import BlockCount, TokenCount

CONFIG = KVCacheConfig(BlockCount(16), (full_attention(4),), TokenCount(32))
T5 = (1, 2, 3, 1, 2)
PROMPT = (1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2)


def admit(t: Any, request: O.AddRequest) -> None:
    """The request arrives, looks up the prefix cache, is allocated and runs its whole prompt."""
    n = len(request.prompt_token_ids)
    t.apply(request)
    hit = t.apply(O.GetComputedBlocks(request.request_id))["num_hit_tokens"]
    t.apply(O.AllocateSlots(request.request_id, n - hit, num_new_computed_tokens=hit, use_computed_blocks=True))
    t.apply(O.SetStatus(request.request_id, "RUNNING"))
    t.apply(O.SetNumComputedTokens(request.request_id, n))


def lora_name_only_key(t: Any) -> None:
    admit(t, O.AddRequest("r1", T5, lora=("a", "/p1")))
    admit(t, O.AddRequest("r2", T5, lora=("a", "/p2")))


def mm_keys_missing_after_creation(t: Any) -> None:
    images = (O.MMFeatureSpec("imgA", 8, 1), O.MMFeatureSpec("imgB", 9, 1))
    admit(t, O.AddRequest("r1", PROMPT, mm_features=images))
    t.apply(O.AppendOutputTokens("r1", (3,)))
    t.apply(O.AllocateSlots("r1", 1))  # caches [8, 12), hashed after the output token
    t.apply(O.SetNumComputedTokens("r1", 12))
    t.apply(O.AppendOutputTokens("r1", (1,)))
    admit(t, O.AddRequest("r2", (*PROMPT, 3, 1), mm_features=images[1:]))


def untagged_extra_keys(t: Any) -> None:
    admit(t, O.AddRequest("r1", T5, lora=("sql", "/loras/sql")))
    admit(t, O.AddRequest("r2", T5, cache_salt="sql"))


SCENARIOS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "K4": ("lora-path", lora_name_only_key),
    "K5": ("mm", mm_keys_missing_after_creation),
    "K6": ("lora", untagged_extra_keys),
}


def ledger_finding(target: Any, scenario: Callable[[Any], None]) -> LedgerFinding | None:
    t = LedgerCheckTarget(target)
    t.reset(bind_release(CONFIG, target))
    try:
        scenario(t)
    except LedgerMismatch as e:
        return e.finding
    return None


def check(bug_id: str, release: str, f: LedgerFinding | None) -> None:
    bug = get_known_bug(bug_id)
    differs, _ = SCENARIOS[bug_id]
    if release in bug.affected_releases:
        assert f is not None, f"{bug_id} not reproduced on {release}"
        assert (f.invariant, f.source, f.differs, f.request_id) == ("kv_read_own_kv", "prefix-hit", differs, "r2")
        assert match_known_bug(f.signature) is bug, f.summary
    else:
        assert f is None, f.summary


class ReleaseSpec(SpecTarget):
    """The spec as the model of one release (what ``bind_release`` binds a config to)."""

    def __init__(self, release: str) -> None:
        super().__init__()
        self.profile = profile_for(release)


@pytest.mark.parametrize("bug_id", sorted(SCENARIOS))
@pytest.mark.parametrize("release", RELEASES)
def test_on_the_spec_of_every_release(bug_id: str, release: str) -> None:
    check(bug_id, release, ledger_finding(ReleaseSpec(release), SCENARIOS[bug_id][1]))


def test_the_bugs_are_recorded_as_fixed_in_0_31() -> None:
    for bug_id in SCENARIOS:
        bug = get_known_bug(bug_id)
        assert bug.fixed_in == "0.31.0" and bug.affected_releases == RELEASES[: RELEASES.index("0.31.0")]


@pytest.mark.vllm
@pytest.mark.parametrize("bug_id", sorted(SCENARIOS))
def test_on_the_installed_vllm(bug_id: str) -> None:
    pytest.importorskip("vllm")
    from kvspec.harness.targets.vllm import VllmTarget

    target = VllmTarget()
    release = target.profile.release
    assert release is not None
    check(bug_id, release, ledger_finding(target, SCENARIOS[bug_id][1]))
