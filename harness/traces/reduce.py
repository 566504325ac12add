"""Reduce a finding's operation trace to a minimal one, by replaying operations directly.

Hypothesis shrinks the *choices* behind a failing example; that finds a short example fast at
first, then slows to a crawl on long traces.  This module shrinks the recorded *operations*
instead: each candidate trace is replayed in lockstep on a fresh spec and a fresh target
(``harness.check.lockstep``, no Hypothesis), and kept when it still ends in the same finding
(``same_finding``: kind, invariant and failing operation agree).  Passes, repeated until none
makes progress or the time budget is spent:

1. cut everything after the failing step;
2. drop whole requests (every operation naming the request);
3. drop runs of operations, halving the run length down to one (delta debugging);
4. shorten prompts from the end, drop what a request carries beyond its tokens (salt, adapter,
   images, embeddings), and shrink the pool (``num_blocks``) and ``max_model_len``.

A candidate that makes the spec reject an operation, or ends in another finding, is simply not
kept: the reduced trace always replays to the same finding, exactly like the original.  Nor is one
no scheduler would send (``harness.core.scheduler_contract``: a prompt or an allocation past
``max_model_len``, more tokens scheduled than the request has), when the original trace was one a
scheduler could send.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvspec.harness.check.lockstep import Finding, FindingError, Lockstep
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.flight import FLIGHT
from kvspec.harness.core.scheduler_contract import get_contract_problem, get_pad_allowance
from kvspec.harness.targets.base import Target, Unsupported
from kvspec.harness.targets.spec import SpecTarget
from kvspec.spec.config import ConfigError, KVCacheConfig

Ops = list[O.Op]
# What an ``AddRequest`` carries beyond its tokens, at its plain value (``plain_requests``).
PLAIN: dict[str, Any] = {
    "lora": None,
    "mm_features": (),
    "cache_salt": None,
    "skip_reading_prefix_cache": False,
    "prompt_embeds": None,
    "prompt_logprob_start": None,
}


@dataclass
class Reduction:
    """The reduced trace and what it cost."""

    config: KVCacheConfig
    ops: Ops
    finding: Finding
    steps: list[tuple[O.Op, object]]  # the reduced trace with the reference's outcomes
    replays: int  # candidate traces replayed
    seconds: float
    before: int  # operations before reduction


def message_shape(message: str) -> str:
    """A finding's message with its numbers, quoted names and list contents blanked out:
    ``group 0 table of 'r1': expected [0, 4], observed [1]`` -> ``group # table of '': expected [#], observed [#]``."""
    shape = re.sub(r"'[^']*'", "''", message)
    shape = re.sub(r"-?\d+", "#", shape)
    return re.sub(r"\[[#, ]+\]", "[#]", shape)


def finding_signature(f: Finding) -> tuple[str, str | None, str | None, str]:
    """What makes two findings "the same": kind, invariant, failing operation and the shape of
    the message (what differed and how, without the numbers)."""
    return f.kind, f.invariant, (f.op or {}).get("op"), message_shape(f.message)


def same_finding(a: Finding, b: Finding) -> bool:
    return finding_signature(a) == finding_signature(b)


def run_ops(
    config: KVCacheConfig,
    ops: Ops,
    target_factory: Callable[[], Target],
    checks: CheckSettings,
) -> tuple[Finding | None, list[tuple[O.Op, object]]]:
    """Replay ``ops`` in lockstep on a fresh spec and target, checked as ``checks`` says: the first
    finding (or None) and the steps applied, with the reference's outcomes."""
    FLIGHT.begin(config)
    ls = Lockstep(config, target_factory(), checks)
    try:
        ls.start()
        for op in ops:
            ls.apply(op)
        ls.finish()  # a full check if the last steps were glimpsed (large pools, harness.core.glimpse)
    except FindingError as e:
        return e.finding, list(ls.steps)
    except Unsupported:
        return None, list(ls.steps)
    return None, list(ls.steps)


def spec_steps(config: KVCacheConfig, ops: Ops) -> list[tuple[O.Op, object]]:
    """``ops`` with the spec's outcomes (None past an operation the spec does not accept)."""
    _, steps = run_ops(config, ops, SpecTarget, CheckSettings())
    return steps + [(op, None) for op in ops[len(steps) :]]


Steps = list[tuple[O.Op, object]]
Runner = Callable[[KVCacheConfig, Ops, Callable[[], Target], CheckSettings], tuple[Finding | None, Steps]]


def is_valid_trace(config: KVCacheConfig, ops: Ops, finding: Finding | None = None) -> bool:
    """Does the spec accept ``ops`` with every invariant holding and the KV ledger satisfied (spec
    against itself)?  A reduced trace must be one a scheduler could send (no token computed
    without its slots, say), not a broken sequence that happens to trip the same check.

    One exception: when the spec itself carries the bug (``kvspec mutants``' ``self`` mode), the
    finding being reduced is a ``reference-invariant`` one, and the spec against itself breaks that
    invariant too; such a trace is valid when that same finding, at its last operation, is the only
    problem (everything before it was accepted with every invariant holding)."""
    found, steps = run_ops(config, ops, SpecTarget, CheckSettings())
    if found is None:
        return len(steps) == len(ops)
    return (
        finding is not None
        and finding.kind == "reference-invariant"
        and found.step == len(ops) - 1
        and same_finding(found, finding)
    )


class _Reducer:
    def __init__(
        self,
        config: KVCacheConfig,
        ops: Ops,
        finding: Finding,
        target_factory: Callable[[], Target],
        checks: CheckSettings,
        deadline: float,
        should_stop: Callable[[], bool] | None = None,
        runner: Runner = run_ops,
    ) -> None:
        self.config, self.ops, self.finding, self.runner = config, ops, finding, runner
        self.target_factory, self.checks = target_factory, checks
        self.deadline, self.should_stop = deadline, should_stop
        self.replays = 0
        self.steps: list[tuple[O.Op, object]] = []
        # The scheduler's bounds, kept when the original trace keeps them (harness.core.scheduler_contract).
        self.pad_allowance = get_pad_allowance(ops)
        self.keeps_contract = get_contract_problem(config, ops, self.pad_allowance, require_used=False) is None

    def is_schedulable(self, config: KVCacheConfig, ops: Ops) -> bool:
        """Could a scheduler send ``ops`` (when the original could; else anything goes)?"""
        if not self.keeps_contract:
            return True
        return get_contract_problem(config, ops, self.pad_allowance, require_used=False) is None

    def out_of_time(self) -> bool:
        """The budget is spent: the deadline passed, or ``should_stop()`` says so (``kvspec fuzz`` on a signal)."""
        return time.monotonic() >= self.deadline or (self.should_stop is not None and self.should_stop())

    def try_candidate(self, config: KVCacheConfig, ops: Ops) -> bool:
        """Keep ``(config, ops)`` if it still ends in the same finding (cut at that step)."""
        if self.out_of_time() or not self.is_schedulable(config, ops):
            return False
        self.replays += 1
        found, steps = self.runner(config, ops, self.target_factory, self.checks)
        if found is None or not same_finding(found, self.finding):
            return False
        if not is_valid_trace(config, [op for op, _ in steps], found):
            return False
        self.config, self.ops, self.finding, self.steps = config, [op for op, _ in steps], found, steps
        return True

    # --- passes --------------------------------------------------------------------------------

    def drop_requests(self) -> bool:
        failing = (self.finding.op or {}).get("request_id")
        progress = False
        for rid in _request_ids(self.ops):
            if rid != failing and not self.out_of_time():
                progress |= self.try_candidate(self.config, [op for op in self.ops if _rid(op) != rid])
        return progress

    def drop_runs(self) -> bool:
        """Delta debugging over the operation list: remove runs of ``n`` operations, ``n`` halving."""
        progress = False
        n = max(1, len(self.ops) // 2)
        while n >= 1 and not self.out_of_time():
            i = 0
            while i < len(self.ops) - 1 and not self.out_of_time():  # the failing op stays last
                candidate = self.ops[:i] + self.ops[i + n :]
                if candidate and self.try_candidate(self.config, candidate):
                    progress = True
                else:
                    i += n
            n //= 2
        return progress

    def shorten_prompts(self) -> bool:
        progress = False
        for i, op in enumerate(self.ops):
            if isinstance(op, O.AddRequest) and len(op.prompt_token_ids) > 1:
                for cut in _shorter_lengths(len(op.prompt_token_ids)):
                    shorter = dataclasses.replace(
                        op,
                        prompt_token_ids=op.prompt_token_ids[:cut],
                        mm_features=tuple(m for m in op.mm_features if m.offset + m.length <= cut),
                    )
                    if i < len(self.ops) and self.try_candidate(
                        self.config, self.ops[:i] + [shorter] + self.ops[i + 1 :]
                    ):
                        progress = True
                        break
        return progress

    def plain_requests(self) -> bool:
        """Drop what a request carries beyond its tokens (a salt, an adapter, images, embeddings,
        prompt logprobs), all at once or one at a time."""
        progress = False
        for i, op in enumerate(self.ops):
            if not isinstance(op, O.AddRequest):
                continue
            extras = [k for k, v in PLAIN.items() if getattr(op, k) != v]
            for keys in ([extras] if len(extras) > 1 else []) + [[k] for k in extras]:  # all, then each
                plain = dataclasses.replace(op, **{k: PLAIN[k] for k in keys})
                if i < len(self.ops) and self.try_candidate(self.config, self.ops[:i] + [plain] + self.ops[i + 1 :]):
                    progress = True
                    break
        return progress

    def shrink_config(self) -> bool:
        progress = False
        for field in ("num_blocks", "max_model_len"):
            for smaller in _shorter_lengths(getattr(self.config, field)):
                candidate = _replace_config(self.config, **{field: smaller})
                if candidate is not None and self.try_candidate(candidate, self.ops):
                    progress = True
                    break
        return progress


def reduce_trace(
    config: KVCacheConfig,
    ops: Ops,
    finding: Finding,
    target_factory: Callable[[], Target],
    checks: CheckSettings = DEFAULT_CHECKS,
    seconds: float = 10.0,
    should_stop: Callable[[], bool] | None = None,
    runner: Runner = run_ops,
) -> Reduction:
    """The smallest trace found within ``seconds`` (or until ``should_stop()``, checked before each
    candidate) that still ends in ``finding`` (the original trace, cut after its failing step, when
    nothing smaller replays to it).  ``runner`` replays one candidate (``run_ops``; a crashing target's
    in a child process, ``harness.drivers.isolated``)."""
    t0 = time.monotonic()
    r = _Reducer(config, list(ops), finding, target_factory, checks, t0 + seconds, should_stop, runner)
    r.replays += 1
    found, steps = runner(config, list(ops), target_factory, checks)
    if found is None or not same_finding(found, finding):
        raise ValueError(f"the trace does not replay to its finding ({finding.summary()}): nothing to reduce")
    r.finding, r.steps, r.ops = found, steps, [op for op, _ in steps]
    before = len(ops)
    passes = (r.drop_requests, r.drop_runs, r.shorten_prompts, r.plain_requests, r.shrink_config)
    progress = True
    while progress and not r.out_of_time():
        progress = False
        for p in passes:
            progress |= p()
    return Reduction(r.config, r.ops, r.finding, r.steps, r.replays, time.monotonic() - t0, before)


# --- helpers ---------------------------------------------------------------------------------------


def _rid(op: O.Op) -> str | None:
    return getattr(op, "request_id", None)


def _request_ids(ops: Ops) -> list[str]:
    return list(dict.fromkeys(op.request_id for op in ops if isinstance(op, O.AddRequest)))


def _shorter_lengths(n: int) -> Iterator[int]:
    """Candidate smaller values for ``n``: the smallest first, then halving steps up to ``n - 1``."""
    seen: set[int] = set()
    for k in (1, n // 4, n // 2, (3 * n) // 4, n - 1):
        if 1 <= k < n and k not in seen:
            seen.add(k)
            yield k


def _replace_config(config: KVCacheConfig, **changes: int) -> KVCacheConfig | None:
    try:
        return dataclasses.replace(config, **changes).validate()  # type: ignore[arg-type]
    except ConfigError:
        return None
