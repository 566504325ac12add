"""Drive vLLM's real ``Scheduler`` through its inputs only, from a ``harness.world.choices.Choices``.

Each engine step: request arrivals (prompts built from a few shared prefixes, so prefix caching
hits, of varied lengths and ``max_tokens``; with the KV connector, some with a remote prefix to
load), sometimes an abort or a ``reset_prefix_cache``, then ``scheduler.schedule()`` and a
``ModelRunnerOutput`` with sampled tokens for the requests it scheduled (a stop token sometimes; with
speculative decoding, the accepted drafts and new drafts after the step), loads that complete or
fail, and ``scheduler.update_from_output``.  The real scheduler decides everything else: admission,
chunking, preemption, frees.  Pools are small, so preemption and refused admission are common.

``draw_config`` draws a kvspec config of a family the real scheduler runs on CPU, ``draw_knobs``
the scheduler knobs; ``run_one`` runs one scheduler for a number of steps with the spec in lockstep
behind the manager proxy (``harness.vllm_sched.proxy``) and returns a ``RunResult``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from math import lcm
from typing import Any

from kvspec.harness.check.finding import Finding, FindingError
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.targets.spec_journal import SpecJournal
from kvspec.harness.vllm_sched.build import SchedKnobs, block_hasher, build_scheduler, model_runner_output
from kvspec.harness.vllm_sched.mirror import ModelMirror, WorldStep
from kvspec.harness.vllm_sched.proxy import install
from kvspec.harness.vllm_sched.sink import LockstepSink
from kvspec.harness.vllm_sched.world_checks import MAX_LOAD_STEPS, WorldChecks
from kvspec.harness.world.choices import Choices
from kvspec.spec.config import KVCacheConfig, chunked_local, full_attention, sliding_window
from kvspec.spec.types import BlockCount, TokenCount

STOP_TOKEN = 7  # a sampled stop token (``stop_token_ids``); prompts never contain it
SCHED_FAMILIES = (
    "full",
    "sliding_window",
    "chunked_local",
    "hybrid_equal",
    "hybrid_diff",
    "no_cache",
    "connector",
    "spec_decode",
)
"""Families the real scheduler runs here: the layouts of ``harness.world.families`` it supports on CPU, plus
``connector`` (full or sliding window with the stub KV connector: async and sync loads, failed ones)
and ``spec_decode`` (ngram speculative decoding: drafts, accepted counts, lookahead slots)."""


def draw_config(ch: Choices, family: str) -> KVCacheConfig:
    """A small kvspec config of ``family`` (one of ``SCHED_FAMILIES``)."""
    bs = ch.choice((2, 4, 8), "block_size")
    if family == "no_cache":
        base = draw_config(ch, ch.choice(("full", "sliding_window", "hybrid_equal"), "layout"))
        return KVCacheConfig(base.num_blocks, base.groups, base.max_model_len, enable_caching=False).validate()
    if family in ("connector", "spec_decode"):
        family = ch.choice(("full", "sliding_window"), "layout")
    window = ch.integer(bs, 6 * bs, "window", boundary=bs)
    groups: tuple[Any, ...]
    if family == "full":
        groups = (full_attention(bs),)
    elif family == "sliding_window":
        groups = (sliding_window(bs, window),)
    elif family == "chunked_local":
        groups = (chunked_local(bs, bs * ch.integer(1, 4, "chunk_blocks")),)
    elif family == "hybrid_equal":
        groups = (full_attention(bs), sliding_window(bs, window))
    elif family == "hybrid_diff":
        groups = (full_attention(bs), sliding_window(2 * bs, ch.integer(2 * bs, 8 * bs, "window", boundary=2 * bs)))
    else:
        raise ValueError(f"unknown scheduler family {family!r} (known: {', '.join(SCHED_FAMILIES)})")
    sbs = lcm(*(int(g.block_size) for g in groups))
    num_blocks = ch.integer(4, 24, "num_blocks") * len(groups) + 1
    mml = sbs * ch.integer(4, 12, "model_len_blocks")
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(mml)).validate()


def draw_knobs(ch: Choices, config: KVCacheConfig, family: str) -> SchedKnobs:
    """The scheduler knobs of one run (small budgets: chunked prefills are common)."""
    sbs = int(config.scheduler_block_size)
    return SchedKnobs(
        token_budget=ch.integer(max(4, sbs), 8 * sbs, "token_budget", boundary=sbs),
        max_num_seqs=ch.integer(1, 4, "max_num_seqs"),
        num_spec_tokens=ch.integer(1, 3, "num_spec_tokens") if family == "spec_decode" else 0,
        connector=family == "connector" and config.enable_caching,
        load_failure_policy=ch.choice(("recompute", "fail"), "load_failure_policy")
        if family == "connector"
        else "recompute",
    )


@dataclass
class RunResult:
    """One run of the real scheduler: counts, and the finding with its lockstep steps if any."""

    config: KVCacheConfig
    knobs: SchedKnobs
    engine_steps: int = 0
    manager_calls: int = 0
    ops: int = 0
    seconds: float = 0.0
    manager_seconds: float = 0.0
    requests: int = 0
    finding: FindingError | None = None
    steps: list[tuple[Any, Any]] = field(default_factory=list)
    skipped: str | None = None
    checks: CheckSettings = DEFAULT_CHECKS  # how its lockstep was checked (relation included)
    known_hits: Counter[str] = field(default_factory=Counter)  # known bug id -> hits (harness.ledger.known_bugs)
    known_first: dict[str, tuple[Finding, list[tuple[Any, Any]]]] = field(default_factory=dict)
    draws: Counter[str] = field(default_factory=Counter)  # integer draws per label (harness.vllm_sched.reduce)


class Driver:
    """The world around one real scheduler: arrivals, the model's outputs, the connector's loads."""

    def __init__(
        self,
        sched: Any,
        config: KVCacheConfig,
        knobs: SchedKnobs,
        ch: Choices,
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus

        self._v = (SamplingParams, DraftTokenIds, KVConnectorOutput, ModelRunnerOutput, Request, RequestStatus)
        self.sched, self.config, self.knobs, self.ch = sched, config, knobs, ch
        self.hasher = block_hasher(config) if (config.enable_caching or knobs.connector) else None
        sbs = int(config.scheduler_block_size)
        self.prefixes = [ch.tokens(ch.integer(1, 3 * sbs, "prefix_len", boundary=sbs), "prefix") for _ in range(3)]
        # Loads fail under every layout: under a window they reproduce known bug K2 (docs/upstream/),
        # which the ledger recognises (harness.ledger.known_bugs) and the run counts; nothing steers around it.
        self.fail_loads = True
        self.next_id = 0
        self.loading: set[str] = set()
        self.max_len = int(config.max_model_len)
        self.on_phase = on_phase  # told "world", "schedule", "update" as each phase of a step begins
        self.world: list[WorldStep] | None = None if on_phase is None else []  # recorded with on_phase
        self.checks: WorldChecks | None = None  # told every fact the world gives (harness.vllm_sched.world_checks)
        self.load_age: dict[str, int] = {}  # request id -> engine steps its load has been in flight

    def _new_request(self) -> Any:
        SamplingParams, _, _, _, Request, _ = self._v
        ch = self.ch
        sbs = int(self.config.scheduler_block_size)
        max_tokens = ch.integer(1, 3 * sbs, "max_tokens", boundary=sbs)
        prefix = ch.choice(self.prefixes, "prefix") if ch.integer(0, 3, "shared") else ()
        room = max(1, self.max_len - max_tokens - len(prefix))
        suffix = ch.tokens(ch.integer(0 if prefix else 1, min(room, 4 * sbs), "suffix_len", boundary=sbs), "suffix")
        prompt = list((prefix + suffix)[: self.max_len - 1])
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN]),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        if self.knobs.connector and ch.integer(0, 2, "remote"):
            load = ch.integer(1, len(prompt), "load", boundary=sbs)
            req.kv_transfer_params = {"load": load, "sync": ch.integer(0, 3, "sync") == 0}
        return req

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def step(self) -> None:
        """One engine step: the world's phase (arrivals, an abort, a prefix-cache reset), the real
        scheduler's ``schedule()``, the model's output fed back (``update_from_output``), then the
        drafter's proposals; the world's checks see each phase."""
        _, DraftTokenIds, KVConnectorOutput, ModelRunnerOutput, _, RequestStatus = self._v
        world = WorldStep()
        if self.world is not None:
            self.world.append(world)
        self._phase("world")
        self._arrivals(world)
        self._abort_or_reset(world, RequestStatus)
        self._phase("schedule")
        out = self.sched.schedule()
        self._phase("update")
        req_ids = list(out.num_scheduled_tokens)
        sampled = self._sampled(out, req_ids, world)
        kv_out = self._connector_output(out, world, KVConnectorOutput, RequestStatus) if self.knobs.connector else None
        mro = model_runner_output(ModelRunnerOutput, req_ids, sampled, kv_out)
        if self.checks is not None:
            self.checks.sampled({rid: tuple(s) for rid, s in zip(req_ids, sampled, strict=True) if s})
            if kv_out is not None:
                self.checks.connector_output(kv_out.finished_recving or (), kv_out.invalid_block_ids or ())
        outputs = self._update(out, mro, world)
        if self.checks is not None:
            self.checks.engine_outputs(outputs)
        if self.knobs.num_spec_tokens:
            self._propose_drafts(world, DraftTokenIds)
        if self.checks is not None:
            self.checks.end_of_step()

    def _arrivals(self, world: WorldStep) -> None:
        """Zero to two new requests, while the backlog is bounded (requests get served, not only queued)."""
        if len(self.sched.requests) >= 8:
            return
        for _ in range(self.ch.integer(0, 2, "arrivals")):
            req = self._new_request()
            world.arrivals.append((req.request_id, tuple(req.prompt_token_ids), req.kv_transfer_params))
            if self.checks is not None:
                self.checks.arrived(req.request_id)
            self.sched.add_request(req)

    def _abort_or_reset(self, world: WorldStep, RequestStatus: Any) -> None:
        """Aborts: sometimes; often once the backlog is full (a request the pool can never hold would
        otherwise block the queue for the rest of the run).  Now and then a prefix-cache reset."""
        ch, sched = self.ch, self.sched
        live = sorted(sched.requests)
        if live and ch.integer(0, 3 if len(live) >= 8 else 19, "abort") == 0:
            world.abort = ch.choice(live, "abort_id")
            if self.checks is not None:
                self.checks.aborted(world.abort)
            sched.finish_requests(world.abort, RequestStatus.FINISHED_ABORTED)
        if ch.integer(0, 29, "reset") == 0:
            world.reset = True
            sched.reset_prefix_cache()

    def _sampled(self, out: Any, req_ids: list[str], world: WorldStep) -> list[list[int]]:
        """The model's tokens per scheduled request: none for a prefill chunk; else some of the drafts
        accepted (never a padding slot) and one bonus token, a stop token now and then."""
        ch, sched = self.ch, self.sched
        sampled: list[list[int]] = []
        for rid in req_ids:
            req = sched.requests[rid]
            if req.num_computed_tokens < req.num_tokens:  # a prefill chunk: nothing sampled
                sampled.append([])
                continue
            drafts = list(out.scheduled_spec_decode_tokens.get(rid, []))
            if -1 in drafts:  # padding slots (a padded decode): never accepted
                drafts = drafts[: drafts.index(-1)]
            accepted = ch.integer(0, len(drafts), "accepted") if drafts else 0
            bonus = STOP_TOKEN if ch.integer(0, 15, "stop") == 0 else ch.token("sampled")
            sampled.append([*drafts[:accepted], bonus])
            world.sampled[rid] = (accepted, bonus)
        return sampled

    def _update(self, out: Any, mro: Any, world: WorldStep) -> Any:
        """``update_from_output``; when recording, how many sampled tokens each request kept (a stop
        drops the rest)."""
        sched = self.sched
        if self.world is None:
            return sched.update_from_output(out, mro)
        taking = {rid: sched.requests[rid] for rid in world.sampled}
        before = {rid: len(req.output_token_ids) for rid, req in taking.items()}
        outputs = sched.update_from_output(out, mro)
        world.kept = {rid: len(req.output_token_ids) - before[rid] for rid, req in taking.items()}
        return outputs

    def _propose_drafts(self, world: WorldStep, DraftTokenIds: Any) -> None:
        """The drafter proposes for the requests this step sampled (the model runner's batch)."""
        ch, ids, drafts = self.ch, [], []
        for r in self.sched.running:
            if r.request_id in world.sampled and ch.integer(0, 3, "draft"):
                ids.append(r.request_id)
                n = ch.integer(0, self.knobs.num_spec_tokens, "num_drafts")
                drafts.append(list(ch.tokens(n, "drafts")))
                world.drafts[r.request_id] = tuple(drafts[-1])
        if ids:
            self.sched.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def _connector_output(self, out: Any, world: WorldStep, KVConnectorOutput: Any, RequestStatus: Any) -> Any:
        """The worker side of the stub connector for one step: loads that finish, and failed ones
        (a block reported invalid)."""
        ch, sched = self.ch, self.sched
        # Loads under way: started by this schedule() or earlier, reported done once (even for a
        # request aborted meanwhile: the worker still finishes its transfer).
        reported = sched.finished_recving_kv_req_ids
        self.loading |= {
            rid
            for rid, r in sched.requests.items()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in reported
        }
        self.loading &= set(sched.requests)  # a request the scheduler dropped cannot be reported (assert)
        for rid in self.loading:
            self.load_age[rid] = self.load_age.get(rid, 0) + 1
            if self.checks is not None:
                self.checks.load_started(rid)
        # Each load ends with chance 1/3 per step, and at the latest after MAX_LOAD_STEPS steps.
        done = {
            rid
            for rid in sorted(self.loading)
            if ch.integer(0, 2, "load_done") == 0 or self.load_age[rid] >= MAX_LOAD_STEPS
        }
        self.loading -= done
        for rid in done:
            del self.load_age[rid]
        world.loads_done = list(done)  # in the order vLLM walks the set it is given
        invalid: set[int] = set()
        for rid in sorted(done):
            if self.fail_loads and len(self.config.groups) == 1 and ch.integer(0, 4, "load_failed") == 0:
                # Only a block the connector was loading: past the local hit, within the load.
                (table,) = sched.kv_cache_manager.get_block_ids(rid)
                computed, sbs = sched.requests[rid].num_computed_tokens, int(self.config.scheduler_block_size)
                first = max(0, computed - sched.connector.loaded.get(rid, 0)) // sbs
                positions = [i for i in range(first, min(-(-computed // sbs), len(table))) if table[i]]
                if positions:
                    i = ch.choice(positions, "invalid_block")
                    invalid.add(table[i])
                    world.load_invalid[rid] = i
        # A synchronous load of this step reported bad: the block holding its last loaded token
        # (a worker reports only blocks it was asked to load).
        loaded = sched.connector.loaded
        sync_loads = {
            r.req_id: r.num_computed_tokens
            for r in out.scheduled_new_reqs
            if (sched.requests[r.req_id].kv_transfer_params or {}).get("sync") and loaded.get(r.req_id, 0) > 0
        }
        single = self.fail_loads and len(self.config.groups) == 1
        if single and sync_loads and ch.integer(0, 3, "sync_load_failed") == 0:
            rid = ch.choice(sorted(sync_loads), "failed_req")
            (table,) = sched.kv_cache_manager.get_block_ids(rid)
            last = (sync_loads[rid] - 1) // int(self.config.scheduler_block_size)
            if 0 <= last < len(table) and table[last]:
                invalid.add(table[last])
                world.sync_failed = rid
        if done or invalid:
            return KVConnectorOutput(finished_recving=done, invalid_block_ids=invalid)
        return None


def agreement_finding(diff: Any, engine_step: int, ops: int) -> Finding:
    """An ``agreement`` finding: kvspec's scheduler model and the real scheduler differ in one engine
    step; ``expected`` holds the model's calls of the step, ``actual`` the real scheduler's."""
    return Finding(
        "agreement",
        max(ops - 1, 0),
        f"kvspec's scheduler model and the real scheduler differ in engine step {engine_step}: {diff.kind}",
        expected=[{"phase": p, **op} for p, op in diff.model],
        actual=[{"phase": p, **op} for p, op in diff.real],
        invariant="model_agrees",
        witness={"engine_step": engine_step, "detail": diff.detail},
    )


def run_one(
    config: KVCacheConfig,
    knobs: SchedKnobs,
    ch: Choices,
    *,
    max_engine_steps: int = 200,
    max_ops: int = 8000,
    deadline: float | None = None,
    checks: CheckSettings = DEFAULT_CHECKS,
    stop: Callable[[], bool] | None = None,
    world_facts: bool = True,
    conservation: bool = True,
    agreement: bool = True,
) -> RunResult:
    """One real scheduler with the spec in lockstep behind its manager, driven until
    ``max_engine_steps``, ``max_ops`` mirrored operations, ``deadline``, ``stop()`` (asked before
    each engine step: a signal came) or the first finding, checked as ``checks`` says.  The world's checks
    (``harness.vllm_sched.world_checks``: ``world_facts``, ``conservation``) and, with ``agreement``, kvspec's scheduler
    model beside the real one (``harness.vllm_sched.mirror``) run after every engine step."""

    sched, spec_config = build_scheduler(config, knobs)
    res = RunResult(spec_config, knobs, checks=checks)
    sink = LockstepSink(spec_config, sched.kv_cache_manager, checks)
    proxy = install(sched, sink)
    driver = Driver(sched, spec_config, knobs, ch, on_phase=sink.set_phase if agreement else None)
    driver.checks = WorldChecks(sink, world_facts, conservation)
    ref, journal = sink.lockstep.ref, SpecJournal()  # the spec calls the model's spec shares with the reference
    mirror = ModelMirror(spec_config, knobs, journal if ref is not None else None) if agreement else None
    if mirror is not None and ref is not None:
        ref.journal = journal
    t = time.perf_counter()
    try:
        while res.engine_steps < max_engine_steps and len(sink.steps) < max_ops:
            if (deadline is not None and time.monotonic() > deadline) or (stop is not None and stop()):
                break
            sink.calls.clear()
            journal.clear()
            start = None if ref is None else ref.state
            driver.step()
            if mirror is not None and driver.world:
                diff = mirror.step(driver.world.pop(), sink.calls, start)
                if diff is not None:
                    raise FindingError(agreement_finding(diff, res.engine_steps, len(sink.steps)))
            res.engine_steps += 1
    except FindingError as e:
        res.finding = e
    finally:
        res.seconds = time.perf_counter() - t
        res.manager_calls = proxy.calls
        res.manager_seconds = proxy.seconds
        res.ops = len(sink.steps)
        res.steps = list(sink.steps)
        res.requests = driver.next_id
        res.known_hits = Counter(sink.lockstep.known_hits)
        res.known_first = {k: (f, steps) for k, (f, steps) in sink.lockstep.known_first.items()}
    return res


__all__ = ["SCHED_FAMILIES", "STOP_TOKEN", "Driver", "RunResult", "WorldStep", "draw_config", "draw_knobs", "run_one"]
