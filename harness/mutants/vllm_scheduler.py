"""Deliberate scheduler-side bugs: runtime patches of vLLM 0.33.0's real ``Scheduler`` class.

``--target mutant:NAME`` of these runs through ``harness.vllm_sched`` (the real scheduler driving
its manager, the spec mirrored behind it), not through a target factory.

Each mutant is a small, realistic mistake in the scheduler (not in the manager), applied by
``patched(name)`` for the duration of a ``with`` block and removed afterwards.  The proxy lockstep
(``harness.vllm_sched.proxy``: the spec beside the real manager, its invariants, the KV ledger) must
catch every one within a few seeded runs of its family (``harness.vllm_sched.driver``), while the
correct scheduler passes the same seeds (tests/vllm_sched/test_vllm_sched_mutants.py).  A mutant
that only drops a manager call (a block never published, a load never reported) is invisible to a
mirror of the calls by construction; these mutants all change what the scheduler tells the manager.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from kvspec.harness.mutants.record import Mutant, Patch, Wrap, by_name, patched_class

SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"


def _preempted_not_freed(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _free_request_blocks(self: Any, request: Any) -> None:
        if request.status.name == "RUNNING":  # _preempt_request frees while the request still runs
            return
        orig(self, request)

    return _free_request_blocks


def _computed_kept_on_preempt(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _preempt_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        n = request.num_computed_tokens
        orig(self, request, *args, **kwargs)
        request.num_computed_tokens = n  # the reset to 0 forgotten: blocks gone, tokens "computed"

    return _preempt_request


def _wrong_request_freed(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _free_request_blocks(self: Any, request: Any) -> None:
        if request.status.name == "RUNNING" and self.running and self.running[0] is not request:
            orig(self, self.running[0])  # the head of the queue instead of the victim
            return
        orig(self, request)

    return _free_request_blocks


def _rejected_drafts_counted(orig: Callable[..., Any]) -> Callable[..., Any]:
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        before = {rid: self.requests[rid].num_computed_tokens for rid in scheduler_output.num_scheduled_tokens}
        out = orig(self, scheduler_output, model_runner_output)
        for rid in scheduler_output.scheduled_spec_decode_tokens:
            request = self.requests.get(rid)
            if request is not None and not request.is_finished() and request.num_computed_tokens < before[rid]:
                request.num_computed_tokens = before[rid]  # the rejection roll-back forgotten
        return out

    return update_from_output


def _freed_kept_running(orig: Callable[..., Any]) -> Callable[..., Any]:
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        running = list(self.running)
        out = orig(self, scheduler_output, model_runner_output)
        for request in running:
            if request.is_finished() and request not in self.running:
                request.status = type(request.status).RUNNING  # freed, yet scheduled again
                request.sampling_params.max_tokens += 8
                self.requests[request.request_id] = request
                self.running.append(request)
        return out

    return update_from_output


def _hit_off_by_one(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _get_local_prefix_cache_hit(self: Any, request: Any, *args: Any) -> Any:
        blocks, num_local, boundary, diverged = orig(self, request, *args)
        if 0 < num_local < request.num_tokens - 1:
            num_local += 1  # one token past the hit counted as cached
        return blocks, num_local, boundary, diverged

    return _get_local_prefix_cache_hit


def last_token_changed(orig: Callable[..., Any]) -> Callable[..., Any]:
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        out = model_runner_output
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids, strict=False):
            request = self.requests.get(rid)
            if request is None or not tokens or tokens[-1] in (6, 7):
                continue
            if len(request.output_token_ids) + len(tokens) >= request.sampling_params.max_tokens:
                tokens[-1] += 1  # the last token of a request ending on max_tokens read off by one
        return orig(self, scheduler_output, model_runner_output)

    return update_from_output


def _aborted_load_forgotten(orig: Callable[..., Any]) -> Callable[..., Any]:
    def finish_requests(self: Any, request_ids: Any, finished_status: Any) -> Any:
        ids = (request_ids,) if isinstance(request_ids, str) else request_ids
        aborting = finished_status.name == "FINISHED_ABORTED"  # an abort from outside, not a failed load
        loading = aborting and [
            r
            for r in (self.requests.get(i) for i in (ids if ids is not None else list(self.requests)))
            if r is not None and r.status.name == "WAITING_FOR_REMOTE_KVS"
        ]
        out = orig(self, request_ids, finished_status)
        for request in loading or ():  # the load's end is never awaited: its blocks are never freed
            self.requests.pop(request.request_id, None)
        return out

    return finish_requests


def _invalid_blocks_ignored(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _handle_invalid_blocks(self: Any, invalid_block_ids: Any, num_scheduled_tokens: Any) -> set[str]:
        return set()  # the connector's report of failed blocks believed away: their tokens stay computed

    return _handle_invalid_blocks


def _budget_one_short(orig: Callable[..., Any]) -> Callable[..., Any]:
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.max_num_scheduled_tokens -= 1  # a step schedules one token fewer than its budget
        try:
            return orig(self, *args, **kwargs)
        finally:
            self.max_num_scheduled_tokens += 1

    return schedule


def _scheduler_mutant(name: str, family: str, doc: str, attr: str, wrap: Wrap, intended: str | None = None) -> Mutant:
    """A mutant of ``Scheduler.attr``; ``family`` is a driver family (``harness.vllm_sched.driver``);
    ``intended``: the one check written to catch it (``ONLY_BY``), when only that one does."""
    return Mutant(name, "vllm-scheduler", doc, family, ("exact",), intended, Patch(SCHEDULER, attr, wrap))


MUTANTS: dict[str, Mutant] = by_name(
    (
        _scheduler_mutant(
            "preempted_not_freed",
            "full",
            "a preempted request keeps its blocks (its table is reused on resumption)",
            "_free_request_blocks",
            _preempted_not_freed,
        ),
        _scheduler_mutant(
            "computed_kept_on_preempt",
            "full",
            "preemption frees the blocks but keeps num_computed_tokens",
            "_preempt_request",
            _computed_kept_on_preempt,
        ),
        _scheduler_mutant(
            "wrong_request_freed",
            "full",
            "preemption frees the head of the running queue instead of the victim",
            "_free_request_blocks",
            _wrong_request_freed,
        ),
        _scheduler_mutant(
            "rejected_drafts_counted",
            "spec_decode",
            "rejected draft tokens stay counted as computed",
            "update_from_output",
            _rejected_drafts_counted,
        ),
        _scheduler_mutant(
            "freed_kept_running",
            "full",
            "a finished request is freed but kept in the running queue",
            "update_from_output",
            _freed_kept_running,
        ),
        _scheduler_mutant(
            "hit_off_by_one",
            "full",
            "the scheduler counts one token past the prefix-cache hit as computed",
            "_get_local_prefix_cache_hit",
            _hit_off_by_one,
        ),
        _scheduler_mutant(
            "last_token_changed",
            "full",
            "a request ending on max_tokens gets a last token the model runner did not sample",
            "update_from_output",
            last_token_changed,
            "world-facts",
        ),
        _scheduler_mutant(
            "aborted_load_forgotten",
            "connector",
            "a request aborted while its KV load is in flight is dropped, its blocks never freed",
            "finish_requests",
            _aborted_load_forgotten,
            "conservation",
        ),
        _scheduler_mutant(
            "invalid_blocks_ignored",
            "connector",
            "the blocks a connector reports failed stay counted as loaded",
            "_handle_invalid_blocks",
            _invalid_blocks_ignored,
        ),
        _scheduler_mutant(
            "budget_one_short",
            "full",
            "each step schedules one token fewer than the token budget allows",
            "schedule",
            _budget_one_short,
            "agreement",
        ),
    )
)
"""The checks of ``kvspec fuzz --target vllm-scheduler`` that a mutant's ``intended`` names: each
catches its mutants alone (tests/vllm_sched/test_world_checks.py runs them with that check off)."""
ONLY_BY = ("world-facts", "conservation", "agreement")


def patched(name: str) -> AbstractContextManager[None]:
    """vLLM's ``Scheduler`` with mutant ``name`` inside the block (schedulers built inside it)."""
    try:
        m = MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler mutant {name!r} (known: {', '.join(sorted(MUTANTS))})") from None
    return patched_class(m.patch)
