"""The ``sglang`` target: SGLang 0.5.23's radix cache driven as its scheduler drives it, held to the
engine-neutral invariants, SGLang's own and the KV ledger, and not to vLLM's policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_cases import fuzz, needs_sglang

from kvspec.harness.check.finding import FindingError
from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.obs_invariants import ObsContext, check_observation
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window

ROOT = Path(__file__).resolve().parents[2]


def test_without_sglang_the_target_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "KVSPEC_SGLANG_VENV": str(tmp_path / "no-venv")}
    kvspec = Path(sys.executable).parent / "kvspec"
    r = subprocess.run(
        [str(kvspec), "fuzz", "--target", "sglang", "--seconds", "5", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "ci/setup --sglang" in r.stderr and "KVSPEC_SGLANG_VENV" in r.stderr


def twins() -> list[O.Op]:
    """Two requests with one 10-token prompt admitted in one step (both miss), computed, then a third
    that repeats it: SGLang inserts the first at its checkpoint and repoints the second's row."""
    p = tuple(range(1, 11))
    ops: list[O.Op] = []
    for rid in ("a", "b"):
        ops += [O.AddRequest(rid, p), O.GetComputedBlocks(rid), O.AllocateSlots(rid, 10, use_computed_blocks=True)]
        ops += [O.SetStatus(rid, "RUNNING")]
    for rid in ("a", "b"):
        ops += [O.SetNumComputedTokens(rid, 10)]
    for rid in ("a", "b"):
        ops += [O.AppendOutputTokens(rid, (20,))]
    ops += [O.Free("a"), O.Free("b"), O.AddRequest("c", p), O.GetComputedBlocks("c")]
    return ops


@needs_sglang
def test_a_twin_is_repointed_to_the_trees_copy_and_the_ledger_accepts_it() -> None:
    from kvspec.harness.sglang.target import SglangTarget

    config = KVCacheConfig(16, (full_attention(2),), 64)
    target = SglangTarget()
    ls = Lockstep(config, target, CheckSettings(relation="invariants"))
    ls.start()
    seen = {}
    for op in twins():
        out = ls.apply(op)  # a broken invariant or ledger rule raises FindingError
        obs = target.observe()
        if isinstance(op, O.AppendOutputTokens):
            seen[op.request_id] = obs.tables[0]
    a, b = seen["a"]["a"], seen["b"]["b"]
    assert len(a) == len(b) == 5
    assert a == b  # b's row now holds the tree's copy: a's pages
    assert out == {"block_ids": [list(a[:4])], "num_hit_tokens": 8}  # c hits a's first 4 pages
    obs = target.observe()
    assert set(a) - set(obs.free_queue) == set(a)  # kept in the tree, out of the free pool
    # The same state under vLLM's policy: unreferenced keyed pages outside the free queue break it.
    vllm = {v.name for v in check_observation(obs, config, ObsContext(requests=ls.book.requests, engine="vllm"))}
    assert "free_iff_unreferenced" in vllm


def decode_past_the_window(prompt: int, steps: int) -> list[O.Op]:
    """One request: its prompt computed in one step, then ``steps`` decode steps."""
    ops: list[O.Op] = [O.AddRequest("a", tuple(range(1, prompt + 1))), O.GetComputedBlocks("a")]
    ops += [O.AllocateSlots("a", prompt, use_computed_blocks=True), O.SetStatus("a", "RUNNING")]
    ops += [O.SetNumComputedTokens("a", prompt)]
    for i in range(steps):
        ops += [O.AppendOutputTokens("a", (100 + i,)), O.AllocateSlots("a", 1)]
        ops += [O.SetNumComputedTokens("a", prompt + i + 1)]
    return ops


def run_window_case(target: Any) -> tuple[Lockstep, KVCacheConfig]:
    config = KVCacheConfig(81, (full_attention(1), sliding_window(1, 8)), 64)
    ls = Lockstep(config, target, CheckSettings(relation="invariants"))
    ls.start()
    for op in decode_past_the_window(20, 12):
        ls.apply(op)  # a broken invariant or ledger rule raises FindingError
    return ls, config


@needs_sglang
def test_a_window_keeps_what_it_reads_and_may_leave_a_hole_vllm_would_not() -> None:
    """Full attention + a window of 8 (SGLang's 7), page size 1, a 20-token prompt then 12 decode
    steps.  The prompt's checkpoint drops the window's pages before position 12; the prompt's last 8
    stay, locked by the tree for the request; the decode slides the window over its own pages.  Every
    read is checked by the ledger, and the table ends with a hole vLLM's policy forbids and SGLang's
    allows: ``0 x12, 8 tree pages, 0 x4, 8 live pages``."""
    from kvspec.harness.sglang.target import SglangTarget

    target = SglangTarget()
    ls, config = run_window_case(target)
    obs = target.observe()
    full, window = obs.tables[0]["a"], obs.tables[1]["a"]
    assert len(full) == len(window) == 32 and 0 not in full
    assert all(b > 40 for b in window if b)  # the window's pages are block ids after the 40 full pages
    assert 0 not in window[32 - 7 :]  # the next query (position 32) reads 25..32: all there
    first = next(i for i, b in enumerate(window) if b)
    assert 0 in window[first:], window  # a hole after a real page
    ctx = {e: ObsContext(requests=ls.book.requests, engine=e) for e in ("sglang", "vllm")}
    assert {v.name for v in check_observation(obs, config, ctx["sglang"])} == set()
    assert "window_nulls_from_front" in {v.name for v in check_observation(obs, config, ctx["vllm"])}


@needs_sglang
def test_a_window_slid_one_token_too_far_is_a_ledger_finding() -> None:
    from kvspec.harness.mutants.sglang import make_mutant_target

    with pytest.raises(FindingError) as e:
        run_window_case(make_mutant_target("sglang_window_off_by_one"))
    assert "kv_read_in_real_block" in str(e.value) and "null block (group 1)" in str(e.value)


def window_frontier_case() -> list[O.Op]:
    """S1 (docs/upstream/sglang-swa-insert-unprotected.md): an 11-token prompt in two chunks under
    pages of 4 and a window of 7 (SGLang's 6), its checkpoint, then a second request that needs a
    page while the pool is full."""
    ops: list[O.Op] = [O.AddRequest("r1", (2, 1, 3, 2, 2, 2, 1, 3, 1, 2, 1)), O.GetComputedBlocks("r1")]
    ops += [O.AllocateSlots("r1", 3, use_computed_blocks=True), O.SetNumComputedTokens("r1", 3)]
    ops += [O.AllocateSlots("r1", 8, has_scheduled_reqs=True), O.SetNumComputedTokens("r1", 11)]
    ops += [O.AppendOutputTokens("r1", (2,)), O.AddRequest("r2", (9, 9, 9)), O.GetComputedBlocks("r2")]
    return ops + [O.AllocateSlots("r2", 3, use_computed_blocks=True)]


@needs_sglang
def test_a_checkpoint_under_a_window_keeps_the_prompt_protected() -> None:
    """S1: SGLang 0.5.22 frees the window's slots so far behind the inserted end that its own match
    after the insert rejects the path: the running request is left unprotected (no cached count,
    its pages unlocked in the tree), and the next allocation evicts and hands out a page it still
    reads.  0.5.23 rounds the kept window up to whole pages: the prompt's two pages stay locked."""
    from kvspec.harness.sglang.load import load_sglang
    from kvspec.harness.sglang.target import SglangTarget

    config = KVCacheConfig(7, (full_attention(4), sliding_window(4, 7)), 9)
    target = SglangTarget()
    ls = Lockstep(config, target, CheckSettings(relation="invariants"))
    ls.start()
    if load_sglang()["version"] == "0.5.22":
        with pytest.raises(FindingError, match="hashed_means_full_and_correct"):
            for op in window_frontier_case():
                ls.apply(op)
        return
    for op in window_frontier_case():
        ls.apply(op)  # a broken invariant or ledger rule raises FindingError
    obs = target.observe()
    assert obs.num_cached_block[0]["r1"] == 2 and "r2" not in obs.tables[0]  # r2 waits: nothing to evict


@needs_sglang
def test_the_frontier_grid_names_the_affected_cases() -> None:
    """``harness.sglang.frontier`` on a corner of its grid: pages of 4, windows 6-9, prompts 10-11
    (0.5.22 leaves windows 6 and 7 unprotected at 10 and 11 tokens, or at 11; 0.5.23 none)."""
    from kvspec.harness.sglang.frontier import find_unprotected
    from kvspec.harness.sglang.load import load_sglang

    found = find_unprotected([4], range(6, 10), range(10, 12))
    expected = {(4, 6): [10, 11], (4, 7): [11]} if load_sglang()["version"] == "0.5.22" else {}
    assert dict(found) == expected


@needs_sglang
@pytest.mark.parametrize(
    "family",
    [
        "full",
        "hybrid_equal",
        pytest.param("request_keys", marks=pytest.mark.full),
        pytest.param("no_cache", marks=pytest.mark.full),
        pytest.param("v0_20", marks=pytest.mark.full),
    ],
)
def test_a_fuzz_run_of_the_real_radix_cache_is_clean(family: str) -> None:
    from kvspec.harness.sglang.target import SglangTarget

    stats = fuzz(SglangTarget, family, seed=3, examples=25)
    assert stats.finding is None, stats.finding
    assert stats.examples >= 10 and stats.steps > 500, (stats.examples, stats.steps)


def test_the_ci_sglang_pins_install_sglang_and_never_torchvision() -> None:
    pins = (ROOT / "ci/sglang/requirements-0.5.23.txt").read_text().splitlines()
    names = [p.split("==")[0].strip().lower() for p in pins if p.strip() and not p.startswith("#")]
    assert "sglang" in names and "torchvision" not in names and "torch" not in names
    assert all("==" in p for p in pins if p.strip() and not p.startswith("#"))


@needs_sglang
@pytest.mark.full  # about 5 s; the comparison's figures are in docs/sglang.md
def test_the_engine_comparison_runs_both_engines_on_one_workload() -> None:
    from kvspec.harness.sglang.compare import CONFIGS, ENGINES, compare, run_one

    config = CONFIGS["page 4, 24 blocks"]
    vllm, sglang = (run_one(factory, config, seed=1, actions=150) for factory in ENGINES.values())
    for r in (vllm, sglang):
        assert 0.0 <= r.hit_rate <= 1.0 and 0.0 <= r.kept <= 1.0 and r.preemptions >= 0
    assert vllm.hit_rate > 0 and sglang.hit_rate > 0  # the world repeats prompts: both engines hit
    table = compare(seeds=1, actions=30)
    assert table.count("SGLang - vLLM (paired)") == len(CONFIGS)
