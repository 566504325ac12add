"""The output side of kvspec's scheduler model (``harness.world.scheduler``): vLLM 0.33
``Scheduler.update_from_output`` for one batch, synchronous or under ``AsyncScheduler``.

``StepOutputs`` is a base class of ``Scheduler`` (split from it along vLLM's own seam, the step's
output as opposed to ``schedule()``); it reads the scheduler's records and queues and finishes
requests through the scheduler's own methods.  Synchronous: rejections roll back, accepted drafts
and the bonus token are appended, verified blocks cached early, new drafts proposed.  Async
(``_update_from_async_output``): the in-flight count drops by the batch's share, stale output of a
preempted request is delivered without moving the counters; with drafts (``_take_async_output``) a
rejection rolls back ``num_computed_tokens`` and ``num_output_placeholders`` after the next step was
already scheduled on the optimistic count, and the verified blocks are cached on the processed basis.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from functools import partial
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.world.choices import Choices
from kvspec.harness.world.records import Batch, RequestChanges, SchedConfig, SReq
from kvspec.harness.world.transfer import KVTransfers
from kvspec.spec.request import RequestStatus


class StepOutputs:
    """``update_from_output`` of kvspec's scheduler model (module docstring); the attributes and
    methods declared here are the scheduler's (``harness.world.scheduler.Scheduler``)."""

    cfg: SchedConfig
    emit: Callable[[O.Op], Any]
    ch: Choices
    reqs: dict[str, SReq]
    running: list[str]
    counts: Counter[str]
    changes: RequestChanges
    transfers: KVTransfers
    stops: Callable[[str, tuple[int, ...]], int | None] | None
    kv_holding: deque[str]
    failing: list[str]

    def finish(self, rid: str) -> None:
        raise NotImplementedError

    def abort(self, rid: str) -> None:
        raise NotImplementedError

    def _remove(self, rid: str) -> SReq:
        raise NotImplementedError

    def _free(self, r: SReq) -> None:
        raise NotImplementedError

    def update_from_output(self, batch: Batch) -> None:
        """vLLM 0.33 ``update_from_output`` for one batch (synchronous or async scheduling)."""
        if self.cfg.async_scheduling:
            self._update_from_async_output(batch)
        else:
            self._update_from_sync_output(batch)

    def _update_from_async_output(self, batch: Batch) -> None:
        """Async scheduling: each request's in-flight count drops by its share of the batch; output
        of a step from before a preemption is stale (delivered, counters untouched)."""
        for rid, n in batch.scheduled.items():
            r = self.reqs.get(rid)
            if r is None:
                continue  # finished or aborted while the step was in flight: output dropped
            self.changes.set_in_flight(r, r.num_in_flight_tokens - n)
            stale = r.num_stale_output_tokens > 0
            if stale:
                r.num_stale_output_tokens -= n
                self.counts["stale_output"] += 1
            if rid in batch.samples:
                if self.cfg.num_spec_tokens:
                    self._take_async_output(r, stale, batch)
                else:
                    self._take_async_token(r, stale)

    def _take_async_token(self, r: SReq, stale: bool) -> None:
        """``_update_request_with_output`` under async scheduling: append the sampled token; a fresh
        one resolves a placeholder and caches the verified blocks of a running request on the
        processed basis (``num_computed_tokens - num_in_flight_tokens``)."""
        running = r.status == RequestStatus.RUNNING
        if r.num_tokens < self.cfg.max_model_len:
            self.changes.apply(r, O.AppendOutputTokens(r.request_id, (self.ch.token(f"sampled:{r.request_id}"),)))
        if not stale and r.num_output_placeholders > 0:
            r.num_output_placeholders -= 1
            if running:
                self.emit(O.CacheBlocks(r.request_id, r.num_computed_tokens - r.num_in_flight_tokens))
                self.counts["early_cache"] += 1
        if r.num_tokens >= self.cfg.max_model_len:
            self.finish(r.request_id)
            self.counts["finish_max_model_len"] += 1

    def _take_async_output(self, r: SReq, stale: bool, batch: Batch) -> None:
        """``update_from_output`` + ``_update_request_with_output`` under async scheduling with drafts.
        The step's drafts are the ``AsyncScheduler`` placeholders it scheduled (a padded admission's
        are all rejected), the world draws how many are accepted.  A fresh output rolls the rejected
        ones back from ``num_computed_tokens`` and ``num_output_placeholders``: the request's next
        step was already scheduled (and its window blocks freed) on the optimistic count.  The
        accepted drafts and the bonus token arrive as sampled tokens (the worker's draft ids never
        reach the scheduler), cut at ``max_model_len`` (a fresh output gives the cut ones' computed
        count back).  A fresh output resolves the placeholders of every returned token and caches
        the verified blocks of a running request on the processed basis; stale output is only
        appended."""
        rid = r.request_id
        drafts = (-1,) * self.cfg.num_spec_tokens if rid in batch.padded else batch.drafts.get(rid, ())
        accepted = 0
        if drafts and rid not in batch.padded:
            accepted = self.ch.integer(0, len(drafts), f"accepted_drafts:{rid}")
        rejected = len(drafts) - accepted
        if rejected and not stale:
            if r.num_computed_tokens > 0:
                self.changes.set_computed(r, r.num_computed_tokens - rejected)
                self.counts["spec_rejection"] += 1
                if r.num_in_flight_tokens:
                    self.counts["rollback_under_next_step"] += 1
            if r.num_output_placeholders > 0:
                r.num_output_placeholders -= rejected
        running = r.status == RequestStatus.RUNNING
        new_tokens = tuple(self.ch.token(f"sampled:{rid}") for _ in range(accepted + 1))
        keep = max(0, min(len(new_tokens), self.cfg.max_model_len - r.num_tokens))
        if 0 < keep < len(new_tokens) and not stale:
            self.changes.set_computed(r, r.num_computed_tokens - (len(new_tokens) - keep))
        if keep:
            self.changes.apply(r, O.AppendOutputTokens(rid, new_tokens[:keep]))
        if not stale and r.num_output_placeholders > 0:
            r.num_output_placeholders -= len(new_tokens)  # every returned token, the cut ones too
            assert r.num_output_placeholders >= 0, f"{rid}: {r.num_output_placeholders} placeholders"
        if not stale and running:
            self.emit(O.CacheBlocks(rid, r.num_computed_tokens - r.num_in_flight_tokens))
            self.counts["early_cache"] += 1
        if r.num_tokens >= self.cfg.max_model_len:
            self.finish(rid)
            self.counts["finish_max_model_len"] += 1

    def _update_from_sync_output(self, batch: Batch) -> None:
        """Rejections roll back, sampled tokens are appended (hashing full blocks), verified blocks
        are cached early under spec decode, new drafts proposed; requests at max_model_len stop."""
        cfg = self.cfg
        scheduled, padded = batch.scheduled, batch.padded
        running = {rid: self.reqs[rid] for rid in self.running}
        waiting_for_kv = RequestStatus.WAITING_FOR_REMOTE_KVS
        holding = {
            rid: self.reqs[rid]
            for rid in self.kv_holding
            if self.reqs[rid].status == waiting_for_kv and rid not in self.failing
        }
        affected, fail, held = self.transfers.recover_invalid_blocks(scheduled, running, self.ch, holding)
        failed = [self._remove(rid) for rid in affected] if fail else []  # failed after the output
        for rid in list(scheduled):
            r = self.reqs.get(rid)
            if r is None or rid not in self.running or rid in affected:
                continue
            if r.num_computed_tokens < r.num_tokens:
                continue  # a partial prefill chunk samples nothing
            drafts = batch.drafts.get(rid, ())
            if rid in padded:
                drafts = (-1,) * cfg.num_spec_tokens
            accepted = 0
            if drafts and rid not in padded:
                accepted = self.ch.integer(0, len(drafts), f"accepted_drafts:{rid}")
            rejected = len(drafts) - accepted
            if rejected and r.num_computed_tokens > 0:
                self.changes.set_computed(r, r.num_computed_tokens - rejected)
                self.counts["spec_rejection"] += 1
            new_tokens = list(drafts[:accepted]) + [self.ch.token(f"sampled:{rid}")]
            # vLLM 0.33 ``_update_request_with_output``: tokens after a stop are dropped, and the
            # computed count gives them back (it covers every kept token but the last).
            keep = min(len(new_tokens), cfg.max_model_len - r.num_tokens)
            stopped = r.num_tokens + keep >= cfg.max_model_len
            told = self.stops(rid, tuple(new_tokens[:keep])) if self.stops is not None else None
            if told is not None:
                keep, stopped = min(keep, told), True
            if keep < len(new_tokens):
                self.changes.set_computed(r, r.num_computed_tokens - (len(new_tokens) - keep))
                new_tokens = new_tokens[:keep]
            if new_tokens:
                self.changes.apply(r, O.AppendOutputTokens(rid, tuple(new_tokens)))
                if cfg.num_spec_tokens > 0:
                    self.emit(O.CacheBlocks(rid, r.num_computed_tokens))
                    self.counts["early_cache"] += 1
            if stopped:
                self.counts["finish_max_model_len" if r.num_tokens >= cfg.max_model_len else "finish_stop"] += 1
                self.finish(rid)
                continue
            if cfg.num_spec_tokens > 0:
                k = self.ch.integer(0, cfg.num_spec_tokens, f"num_drafts:{rid}")
                drafts = tuple(self.ch.token(f"draft:{rid}") for _ in range(k))
                self.changes.set_spec(r, drafts)
                if drafts:
                    self.counts["drafts"] += 1
        self._fail_together(failed, held)

    def _fail_together(self, failed: list[SReq], held: list[str]) -> None:
        """vLLM 0.33 ``update_from_output`` fails every request a failed load affects (``fail``
        policy) after the step's output, with one ``finish_requests(ids, FINISHED_ERROR)``: the
        running ones (``failed``) are freed, those whose load is pending (their own failed load,
        ``failing``, or another load's invalid block, ``held``) only when it reports.  That call
        walks a ``set`` of request-id strings, whose order is Python's string hashing
        (``PYTHONHASHSEED``, random per process), no function of the inputs: the world picks it
        (``fail_order``: the running ones first, in running order, is the simplest answer)."""
        group: dict[str, Callable[[], None]] = {r.request_id: partial(self._free, r) for r in failed}
        for rid in [*self.failing, *held]:  # asynchronous loads failed under ``fail``
            group[rid] = partial(self.abort, rid)
        self.failing = []
        todo = list(group)
        while todo:
            rid = self.ch.choice(todo, "fail_order") if len(todo) > 1 else todo[0]
            todo.remove(rid)
            group[rid]()
