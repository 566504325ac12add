"""A small model of vLLM 0.33's scheduler-side request bookkeeping (``vllm/v1/core/sched/scheduler.py``).

It decides *which* KV-cache manager calls a real scheduler makes, in which order, and emits them as
``harness.core.ops`` operations through ``emit`` (which applies them to the spec and the target and
returns the outcome).  Only the FCFS policy and one sampled token per step are modelled, with
synchronous or async scheduling (``AsyncScheduler`` with a batch queue of two); every choice the real scheduler
leaves to the world (chunk budgets, accepted drafts, sampled tokens, connector answers, load
failures) comes from ``choices``, which the Hypothesis state machine backs with draws.

Modelled (0.33 ``schedule()`` / ``update_from_output``):
- running loop: ``allocate_slots(n, lookahead)``; on None preempt ``running[-1]`` (free,
  ``num_computed_tokens = 0``, drafts cleared, to the front of ``waiting``) until it fits or the
  request preempted itself; after a preemption no waiting request is admitted this step;
- waiting loop: ``kv_holding_waiting`` first; remote-KV requests still loading are skipped; a
  request with ``num_computed_tokens == 0`` looks up the prefix cache, asks the connector (P/D),
  then ``allocate_slots``; None stops admission (``break``); an async load allocates with
  ``delay_cache_blocks=True``, the blocks in-flight prefills still need set aside
  (``reserved_blocks``), and parks the request in WAITING_FOR_REMOTE_KVS;
- spec decode: drafts scheduled, rejection rolls ``num_computed_tokens`` back, accepted + bonus
  tokens appended, verified blocks cached early; a one-token admission padded to ``1 + k`` when the
  running loop scheduled no prefill chunk (``is_prefill_chunk`` as each request's last step left it);
- P/D arrival: ``cache_blocks(num_computed_tokens)`` then the ``num_tokens - 1`` cap; failed loads
  cache the valid prefix or free everything; abort while loading delays the free until arrival;
  invalid blocks of a synchronous load truncate every running request holding them (``fail``:
  evicted, the requests failed after the output), and, scanned first, every asynchronous load still
  waiting whose computed blocks hold them (it fails as its own failed load would);
  ``harness.world.transfer``;
- finishing: ``remove_skipped_blocks`` (with a connector, blocks or not) then ``free``; a stop
  drops the sampled tokens after it and gives back their computed count;
- encoder-decoder: the admission that schedules a request's encoder inputs (``num_computed_tokens
  == 0``) passes their length as ``num_encoder_tokens``; no prefix cache, connector or drafts;
- async scheduling (``EngineCore.step_with_batch_queue``, two batches in flight): a step's tokens
  stay in ``num_in_flight_tokens`` until its output is processed, sampling steps add output
  placeholders, verified blocks are cached on ``num_computed_tokens - num_in_flight_tokens``, a
  preemption marks the in-flight output stale (delivered, counters untouched) and the request is
  not resumed before it drains; no connector (vLLM defers frees with a consumer connector, which
  the manager API does not show);
- async scheduling with drafts (``AsyncScheduler._update_after_schedule``): a step that samples
  adds ``1 + len(scheduled_spec_decode_tokens)`` output placeholders and sets ``spec_token_ids``
  to ``[-1] * num_spec_tokens`` (``SReq.num_spec_placeholders``: scheduler-only, the worker fills
  in the draft ids, so no ``SetSpecTokens``); the running loop (``schedule``) then schedules
  ``num_tokens_with_spec + num_output_placeholders - num_computed_tokens`` tokens, i.e. the
  unreturned sampled token and ``k`` draft placeholders, while the previous batch is still in
  flight, and ``allocate_slots`` frees window blocks on that optimistic count (0.26+: less
  ``num_in_flight_tokens``); ``update_from_output`` (``StepOutputs._take_async_output``) later
  rolls the rejected drafts back from ``num_computed_tokens`` and ``num_output_placeholders``
  (fresh output only; stale output of a preempted request is appended, counters untouched),
  appends accepted drafts + bonus token (cut at ``max_model_len``, ``_update_request_with_output``),
  resolves their placeholders and calls ``cache_blocks(num_computed_tokens - num_in_flight_tokens)``
  for a running request; no ``update_draft_token_ids`` (``EngineCore.post_step`` skips it under
  async scheduling).  A one-token admission is padded to ``1 + k`` (its ``k`` placeholders are
  rejected) as in the synchronous case.

The output side (``update_from_output``) is ``harness.world.outputs.StepOutputs``, a base class.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import new_book_request
from kvspec.harness.world.choices import Choices
from kvspec.harness.world.outputs import StepOutputs
from kvspec.harness.world.records import Batch, RequestChanges, SchedConfig, SReq
from kvspec.harness.world.transfer import KVTransfers
from kvspec.spec.request import RequestStatus


@dataclass
class Admission:
    """A waiting request being admitted: its computed tokens (``local`` from the prefix cache, ``ext``
    from the connector, ``load_async`` when those arrive later), whether it looked its prefix up."""

    request: SReq
    num_computed: int
    local: int = 0
    ext: int = 0
    load_async: bool = False
    looked_up: bool = False


class Scheduler(StepOutputs):
    """vLLM 0.33's scheduler-side bookkeeping (module docstring); its KV-transfer side is
    ``transfers`` (``harness.world.transfer.KVTransfers``), its records change through ``changes``
    (``harness.world.records.RequestChanges``)."""

    def __init__(
        self,
        cfg: SchedConfig,
        emit: Callable[[O.Op], Any],
        choices: Choices,
        table: Callable[[str], tuple[int, ...]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.emit = emit
        self.ch = choices
        self.reqs: dict[str, SReq] = {}
        self.waiting: deque[str] = deque()
        self.kv_holding: deque[str] = deque()
        self.running: list[str] = []
        self.in_flight: deque[Batch] = deque()  # async: batches whose output is not processed yet
        self.counts: Counter[str] = Counter()
        self.changes = RequestChanges(emit)
        self.transfers = KVTransfers(cfg, emit, self.changes, self.counts, table)
        self._next_id = 0
        # Does a request stop on the tokens it just sampled (a stop token, its max_tokens), and how
        # many of them does it keep?  ``stops(request_id, new_tokens)``: the count kept, or None.
        # The world's knowledge, asked only when set (harness.vllm_sched.agreement replays vLLM's
        # own stops); the workloads stop requests through their ``finish`` action instead.
        self.stops: Callable[[str, tuple[int, ...]], int | None] | None = None
        # vLLM 0.33 ``_inflight_prefills``: requests admitted to load asynchronously or to prefill in
        # more than one chunk, until a step leaves them with no prompt to compute (an asynchronous
        # load's admission sets their remaining blocks aside: ``KVTransfers.reservation``).
        self.inflight_prefills: set[str] = set()
        # Asynchronous loads failed under ``fail`` this step (``fail_load``): finished with the step's
        # other failed requests after its output (``StepOutputs._fail_together``).
        self.failing: list[str] = []

    # --- request lifecycle ---------------------------------------------------------------------

    def new_request_id(self) -> str:
        self._next_id += 1
        return f"r{self._next_id}"

    def reads_external_kv(self, r: SReq) -> bool:
        """Whether the connector is asked for ``r``'s KV: not when it skips prefix-cache reads (0.33
        ``Scheduler.schedule``), nor, from 0.34 (``Request.skip_reading_external_kv``), when its reads
        are bounded by a hit limit (``spec.request.get_prefix_cache_hit_limit``)."""
        if r.skip_reading_prefix_cache:
            return False
        return not (self.cfg.profile.hit_limit_from_logprob_start and r.prompt_logprob_start is not None)

    def add_request(self, op: O.AddRequest) -> None:
        """vLLM ``add_request``: the engine builds the Request (hashing its prompt) and queues it."""
        self.emit(op)
        self.reqs[op.request_id] = SReq(**vars(new_book_request(op)))
        self.waiting.append(op.request_id)
        self.counts["add_request"] += 1

    def _free(self, r: SReq) -> None:
        """``_free_request``: with a connector, drop out-of-window blocks first (processed basis),
        whether or not the request holds blocks (vLLM 0.33 ``_connector_finished``)."""
        if self.cfg.connector:
            self.emit(O.RemoveSkippedBlocks(r.request_id, max(0, r.num_computed_tokens - r.num_in_flight_tokens)))
        self.emit(O.Free(r.request_id))

    def preempt(self, r: SReq) -> None:
        """``_preempt_request``: free (tail first), PREEMPTED, ``num_computed_tokens = 0``, drafts
        cleared, back to the front of ``waiting``."""
        self.emit(O.Free(r.request_id))
        self.inflight_prefills.discard(r.request_id)
        self.changes.set_status(r, RequestStatus.PREEMPTED)
        self.changes.set_computed(r, 0)
        self.changes.set_spec(r, ())
        # Async: in-flight output turns stale (delivered later, counters untouched).
        r.num_stale_output_tokens = r.num_in_flight_tokens
        r.num_output_placeholders = 0
        r.num_spec_placeholders = 0
        r.num_preemptions += 1
        self.waiting.appendleft(r.request_id)
        self.counts["preempt"] += 1

    def finish(self, rid: str) -> None:
        """A request stops (EOS / max tokens; under async scheduling stale output of a preempted,
        waiting request can stop it too): its blocks are freed."""
        self._free(self._remove(rid))
        self.counts["finish"] += 1

    def _remove(self, rid: str) -> SReq:
        """Take a request out of the scheduler, whatever queue holds it."""
        r = self.reqs.pop(rid)
        self.inflight_prefills.discard(rid)
        if rid in self.running:
            self.running.remove(rid)
        for q in (self.waiting, self.kv_holding):
            if rid in q:
                q.remove(rid)
        return r

    def abort(self, rid: str) -> None:
        """``finish_requests(ABORTED)`` for a request in any queue."""
        r = self._remove(rid)
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and r.recv == "pending":
            self.transfers.abort_while_loading(r)
            return
        self._free(r)
        self.counts["abort"] += 1

    def kv_arrives(self, rid: str, ok: bool, valid_tokens: int = 0) -> None:
        """The worker reports ``finished_recving`` (or a failed load) for an async P/D load."""
        if not self.transfers.arrived_after_abort(rid):
            self.transfers.load_finished(self.reqs[rid], ok, valid_tokens)

    def fail_load(self, rid: str, valid_tokens: int) -> None:
        """An asynchronous load reports invalid blocks under the ``fail`` policy (before the step's
        output is processed): its request is truncated now (``KVTransfers.truncate_failed_load``) and
        aborted while its load is pending with the step's other failed requests, after the output
        (vLLM 0.33 ``update_from_output``: ``_handle_invalid_blocks``, then ``finish_requests``)."""
        self.transfers.truncate_failed_load(self.reqs[rid], valid_tokens)
        self.failing.append(rid)

    # --- one engine step -----------------------------------------------------------------------

    def step(self) -> None:
        """One engine step: ``schedule()``, the forward pass, ``update_from_output`` (synchronous),
        or ``EngineCore.step_with_batch_queue`` under async scheduling."""
        if self.cfg.async_scheduling:
            self._step_with_batch_queue()
        else:
            self.update_from_output(self.schedule())
        self.counts["step"] += 1

    def _step_with_batch_queue(self) -> None:
        """vLLM 0.33 ``EngineCore.step_with_batch_queue`` (queue of 2): schedule a batch while the
        queue has room and requests remain, else process the oldest batch's output."""
        if self.reqs:
            batch = self.schedule()
            if self.in_flight and (batch.drafts or batch.padded):
                self.counts["drafts_in_flight"] += 1  # drafts scheduled while a batch is in flight
            self.in_flight.append(batch)
            if len(self.in_flight) < 2:
                return
        elif not self.in_flight:
            return
        self.update_from_output(self.in_flight.popleft())

    def schedule(self) -> Batch:
        cfg = self.cfg
        budget = self.ch.integer(1, cfg.token_budget, "token_budget", boundary=cfg.block_size)
        batch = Batch()
        scheduled, padded = batch.scheduled, batch.padded
        preempted = False
        prefill_scheduled = False
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.reqs[self.running[i]]
            n = min(
                r.num_tokens_with_spec + r.num_spec_placeholders + r.num_output_placeholders - r.num_computed_tokens,
                budget,
                cfg.max_model_len - r.num_computed_tokens - 1,
            )
            if n <= 0:
                i += 1
                continue
            out = None
            while True:
                out = self.emit(O.AllocateSlots(r.request_id, n, num_lookahead_tokens=cfg.num_lookahead_tokens))
                if out is not None:
                    break
                victim = self.reqs[self.running.pop()]
                self.preempt(victim)
                preempted = True
                if victim is r:
                    break
            if out is None:
                break
            scheduled[r.request_id] = n
            prefill_scheduled |= r.is_prefill_chunk  # as its last step left it (vLLM 0.33)
            self.counts["decode" if r.num_computed_tokens >= r.num_tokens - 1 else "prefill_chunk"] += 1
            budget -= n
            i += 1
            if r.spec_token_ids or r.num_spec_placeholders:
                k = n + r.num_computed_tokens - r.num_tokens - r.num_output_placeholders
                if k > 0:
                    batch.drafts[r.request_id] = (r.spec_token_ids or (-1,) * r.num_spec_placeholders)[:k]
                self.changes.set_spec(r, ())
                r.num_spec_placeholders = 0
        if not preempted:
            self._admit_waiting(budget, scheduled, padded, prefill_scheduled)
        self._update_after_schedule(batch)
        return batch

    def _update_after_schedule(self, batch: Batch) -> None:
        """vLLM 0.33 ``_update_after_schedule`` (+ ``AsyncScheduler``'s): the computed and in-flight
        counts advance by what was scheduled; a step that is no prefill chunk samples a token,
        which async scheduling counts as an output placeholder until it returns, with one more per
        scheduled draft, and then sets the next step's ``k`` draft placeholders."""
        for rid, n in batch.scheduled.items():
            r = self.reqs[rid]
            self.changes.set_computed(r, r.num_computed_tokens + n)
            if self.cfg.async_scheduling:
                self.changes.set_in_flight(r, r.num_in_flight_tokens + n)
            r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens + r.num_output_placeholders
            if not r.is_prefill_chunk:
                self.inflight_prefills.discard(rid)
                batch.samples.add(rid)
                if self.cfg.async_scheduling:
                    k = self.cfg.num_spec_tokens
                    r.num_output_placeholders += 1 + (k if rid in batch.padded else len(batch.drafts.get(rid, ())))
                    r.num_spec_placeholders = k

    def _admit_waiting(self, budget: int, scheduled: dict[str, int], padded: set[str], prefill_scheduled: bool) -> None:
        """vLLM 0.33 ``Scheduler.schedule``'s loop over the waiting requests, while budget and seats
        last, in named steps; requests set aside go back to the front of their queues, in order."""
        skipped: dict[str, list[str]] = {"holding": [], "waiting": []}
        running_scheduled = bool(scheduled)  # by the running loop (admissions below do not count)
        while budget > 0:
            # 1. The next request: those holding an async load first, then the waiting queue.
            queue = self.kv_holding if self.kv_holding else self.waiting
            if not queue or len(self.running) >= self.cfg.max_num_seqs:
                break
            aside = skipped["holding" if queue is self.kv_holding else "waiting"]
            r = self.reqs[queue[0]]
            # 2. A request that cannot go on this step is set aside.
            if not self._ready_to_admit(r):
                aside.append(queue.popleft())
                continue
            # 3. Its computed tokens: a prefix-cache lookup, and the connector's external tokens.
            a = self._computed_tokens(r)
            # 4. How many tokens to schedule; None: the padded decode does not fit the budget.
            n = self._tokens_to_admit(a, budget, padded, prefill_scheduled, running_scheduled)
            if n is None:
                break
            # 5. The manager's allocation; refused, admission stops for this step.
            if self._allocate_admitted(a, n) is None:
                padded.discard(r.request_id)
                self.counts["admission_refused"] += 1
                break
            # 6. An async load waits aside for its KV; any other request runs.
            if a.load_async:
                self._await_async_load(r, a.num_computed)
                queue.popleft()
                skipped["holding"].append(r.request_id)  # back to the front of the holding queue
                continue
            queue.popleft()
            budget -= self._run_admitted(r, a, n, scheduled)
        for rid in reversed(skipped["waiting"]):
            self.waiting.appendleft(rid)
        for rid in reversed(skipped["holding"]):
            self.kv_holding.appendleft(rid)

    def _ready_to_admit(self, r: SReq) -> bool:
        """Not while deliverable stale output of async scheduling is in flight (resuming could resample
        it), nor while its remote KV is still pending; a remote load that finished is taken in."""
        if r.num_stale_output_tokens:
            return False
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            if r.recv == "pending":
                return False
            self.transfers.update_waiting_for_remote_kv(r)
        return True

    def _computed_tokens(self, r: SReq) -> Admission:
        """A fresh request looks up its prefix (``get_computed_blocks``) and asks the connector for
        external tokens; a resumed one keeps its computed tokens."""
        if r.num_computed_tokens:
            return Admission(r, r.num_computed_tokens)
        hit = self.emit(O.GetComputedBlocks(r.request_id))
        local = hit["num_hit_tokens"]
        self.counts["prefix_hit" if local else "prefix_miss"] += 1
        ext, load_async = 0, False
        if self.cfg.connector and self.reads_external_kv(r):
            ext, load_async = self.transfers.ask_connector(r, local, self.ch)
        return Admission(r, local + ext, local, ext, load_async, looked_up=True)

    def _tokens_to_admit(
        self, a: Admission, budget: int, padded: set[str], prefill_scheduled: bool, running_scheduled: bool
    ) -> int | None:
        """0 for an async load (it only allocates what its KV will fill); else the tokens left, within the
        budget, a one-token decode padded with the draft slots under speculative decoding (None when
        those do not fit the budget)."""
        cfg, r = self.cfg, a.request
        if a.load_async:
            return 0
        n = r.num_tokens - a.num_computed
        if (
            cfg.num_spec_tokens > 0
            and n == 1
            and not prefill_scheduled
            and (running_scheduled or a.num_computed > 0)
            and a.num_computed + 1 + cfg.num_spec_tokens + 1 <= cfg.max_model_len
        ):
            if 1 + cfg.num_spec_tokens > budget:
                return None
            n = 1 + cfg.num_spec_tokens
            padded.add(r.request_id)
        n = min(n, budget)
        assert n > 0
        return n

    def _allocate_admitted(self, a: Admission, n: int) -> Any:
        """``allocate_slots`` for the admission: the new tokens, the hit, the external tokens (delayed
        caching for an async load, which reserves what in-flight prefills still need)."""
        cfg, r = self.cfg, a.request
        return self.emit(
            O.AllocateSlots(
                r.request_id,
                n,
                num_new_computed_tokens=a.local,
                use_computed_blocks=a.looked_up,
                num_lookahead_tokens=0 if a.load_async else cfg.num_lookahead_tokens,
                num_external_computed_tokens=a.ext,
                delay_cache_blocks=a.load_async,
                num_encoder_tokens=self._encoder_tokens(r, a.num_computed),
                full_sequence_must_fit=cfg.reserve_full_isl,
                reserved_blocks=self.transfers.reservation(self.inflight_prefills, self.reqs) if a.load_async else 0,
                has_scheduled_reqs=bool(self.running),  # the watermark holds back admissions only then
            )
        )

    def _await_async_load(self, r: SReq, num_computed: int) -> None:
        """The request waits for its remote KV (set aside: it is not scheduled this step)."""
        self.changes.set_status(r, RequestStatus.WAITING_FOR_REMOTE_KVS)
        self.changes.set_computed(r, num_computed)
        r.recv = "pending"
        self.inflight_prefills.add(r.request_id)
        self.counts["async_load"] += 1

    def _run_admitted(self, r: SReq, a: Admission, n: int, scheduled: dict[str, int]) -> int:
        """The request runs with ``n`` tokens scheduled; returns ``n`` (the budget it takes)."""
        self.running.append(r.request_id)
        scheduled[r.request_id] = n
        self.changes.set_status(r, RequestStatus.RUNNING)
        self.changes.set_computed(r, a.num_computed)
        r.sync_ext_this_step = a.ext
        if a.num_computed + n < r.num_tokens:
            self.inflight_prefills.add(r.request_id)
        self.counts["admit_resumed" if r.num_preemptions else "admit"] += 1
        if a.ext:
            self.counts["sync_load"] += 1
        return n

    def _encoder_tokens(self, r: SReq, num_computed: int) -> int:
        """vLLM 0.33 ``_try_schedule_encoder_inputs`` for an encoder-decoder model: the encoder
        inputs (all at position 0) are scheduled while no decoder token is computed, and their
        embeddings are passed as ``num_encoder_tokens``; later steps pass 0."""
        if not self.cfg.encoder_decoder or num_computed > 0:
            return 0
        return sum(m.length for m in r.mm_features)

    # --- queries for rules ---------------------------------------------------------------------

    def loading(self) -> list[str]:
        return [rid for rid, r in self.reqs.items() if r.recv == "pending"] + list(self.transfers.loading_aborted)

    def idle(self) -> bool:
        return not self.reqs and not self.transfers.loading_aborted and not self.in_flight
