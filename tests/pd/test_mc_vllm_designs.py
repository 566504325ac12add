"""``VLLM_PUSH``, ``VLLM_PULL`` and ``AS_WRITTEN`` (harness/pd/mc/designs.py) checked against vLLM itself.

The two designs are flag sets written by hand.  Here each flag that the search
(harness/pd/mc/model.py, moves.py) reads for the design's transfer mode gets its value from
what vLLM does.  The code under test is vLLM's real ``Scheduler`` with the real scheduler side
of ``NixlPushConnector`` (push) or ``NixlConnector`` (pull), on CPU.  That side needs no NIXL
library.  P (``kv_producer``) and D (``kv_consumer``) are two separate ``Scheduler`` objects.
The test moves messages between them by hand, taking them from the scheduler outputs: D's
``push_registrations``, P's ``push_finished_blocks``, the ``kv_transfer_params`` that P's
``request_finished`` returns, and D's ``reqs_to_recv``.  It plays each worker by returning
``finished_recving`` / ``finished_sending`` in ``KVConnectorOutput``.

Two kinds of check:

- flag by flag (``DERIVED``): a scenario per flag, and a function that reads the flag's value
  off what vLLM did.  ``test_design_flag_matches_vllm`` compares that value with the design's.
- traces (``TRACES``): a scenario's ordered events, each one a model move label plus what
  could be seen after it (D's phase for the request, P's phase, the messages sent).
  ``replay`` searches ``moves.successors`` from ``state.init_state`` under ``BOUNDS`` for a path
  whose moves have those labels and give those observations.  When none exists, the run
  vLLM made is not a run of the model.

A vLLM event is one model move:

======================================  ==============================================
vLLM                                    model move
======================================  ==============================================
proxy sends the request to P (and D)    ``r0 arrives`` (router; to D too: ``AS_WRITTEN``)
P's answer reaches the proxy, which     ``deliver Prefilled(r0) to router; router picks D0``
sends the request to D (push, pull)
``P.add_request``                       ``deliver Prefill(r0) to P``
P schedules, finishes (max_tokens=1)    ``P prefills r0``
D schedules and allocates the request   ``deliver Reserve`` (push) / ``deliver Decode`` (pull)
D's registration reaches P's worker     ``deliver Register(r0@D0) to P``
proxy aborts the request                ``r0 is aborted``
``D.finish_requests(.., ABORTED)``      ``deliver Cancel(r0@D0) to D0``
``P.finish_requests(.., ABORTED)``      ``deliver Abort(r0) to P``
P's worker: ``finished_sending``        ``deliver Write`` (push: WRITE done),
                                        ``deliver ReadDone`` (pull: D's read notice),
                                        or ``P's hold on r0's KV expires`` (lease)
D's worker: ``finished_recving``        ``deliver Done`` (push) / ``deliver Read`` (pull)
D schedules the request's tokens        ``D0 runs r0``
======================================  ==============================================

Where a message comes from a worker, the test writes it in by hand and the comment names the
worker function it comes from.  The scheduler's own messages are read off its outputs.

Flags checked here against vLLM (scenario -> flag):

- ``transfer``: D's first ``schedule`` registers its blocks with P before P has the request
  (push).  The pull D reads the blocks named by P's ``request_finished``.
- ``release`` (push): abort while ``WAITING_FOR_REMOTE_KVS``.  D frees the blocks only on
  ``finished_recving``.
- ``revoke`` (push): after that abort D's connector emits nothing about the request.
- ``timeout_releases`` (push): the ``push_registration_timeout`` watchdog fires and frees
  nothing.
- ``d_tombstones_cancelled``: an abort that reaches D before D scheduled the request means it
  is never allocated.
- ``wait_for_arrival``: the request gets no tokens scheduled until ``finished_recving``.
- ``free_on_release``: after the delayed free the blocks are back in the pool and the record
  is gone.
- ``skip_d_hits`` (push): with a local prefix hit, the registration lists only the blocks past
  the hit.
- ``defer_free_while_loading`` (pull): abort during the read.  D frees on ``finished_recving``.
- ``producer_delayed_free``: P's ``request_finished`` keeps the blocks under a
  ``reqs_to_send`` deadline.  P frees them on ``finished_sending``.
- ``hold_outlives_transfers``: the hold is a wall-clock lease (deadline = now +
  ``kv_lease_duration``).  P's scheduler frees on any ``finished_sending``.  The worker's real
  ``NixlBaseConnectorWorker._reap_expired_send_leases`` (base_worker.py), run with a stub
  ``self``, reports an expired lease as sent while a transfer of it is still counted in flight.
- ``reserve_within_capacity``: a second request finds no free block.  D neither allocates it
  nor registers it; it waits.
- ``queue_when_full``: that second request stays queued, not refused, and is allocated and
  registered once the first request's blocks are freed.
- ``abort_reaches_finished_p``: an abort that reaches P after the prefill finds a finished
  request: P keeps its KV under the lease and still reports the send.
- ``publish_on_arrival`` (the fuzz reads it, the search does not): D's blocks give a second
  request no prefix hit before ``finished_recving``.

Flags not checked here, and why:

- ``done_after_completions`` (push): worker only.  P's WRITE carries D's completion notice
  (push_worker.py ``NixlPushConnectorWorker._xfer_blocks``, ``make_prepped_xfer(...,
  notif_msg=...)``).  D reports ``finished_recving`` only when that notice arrives
  (``_get_new_notifs``), and P reports the send done when its WRITE handles finish
  (``get_transfer_results``).  The traces bring D's ``finished_recving`` in after P's.
- ``fence_on_peer_failure``: worker / NIXL.  Neither scheduler has an input for "P failed".
  Failures come back only as ``failed_recving`` / invalid blocks from the worker
  (push_worker.py ``_send_registration_to_p``, ``_do_send_reg_notif``; base_worker.py).
  Nothing drops a failed P's WRITEs in flight.  The bounds used here have no crash.
- ``fence_restarted_d``: NIXL agent registration (base_worker.py ``register_kv_caches``,
  ``add_remote_agent``).  A restarted D is a new agent with new memory registrations.
  ``KVTransferConfig.engine_id`` defaults to a fresh uuid, and the registration names D by
  it.  Whether a stale WRITE can land is NIXL's business.
- ``cancel_on_abort``: the router is the proxy, not vLLM's engine.  The traces have the proxy
  abort the request on both instances.
- ``p_tombstones_revoked``, ``resend_revoke``: the model reads them only after a Revoke, and
  with ``revoke=False`` none is sent.
- Pull designs: the model reads ``release``, ``skip_d_hits``, ``done_after_completions``,
  ``timeout_releases`` and ``revoke`` only for push.  ``VLLM_PULL`` inherits ``BASELINE``'s
  values for them, and those values mean nothing for pull.

The push traces come in two dispatches: vLLM's push proxy (P first, D once P answered:
``VLLM_PUSH``) and the seed's router (P and D at once: ``AS_WRITTEN``, which is otherwise vLLM's
push).  vLLM's proxy is test code, not in the wheel; ``dispatch`` rests on reading it
(``PUSH_FORWARDED``), and the traces play it by hand.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from kvspec.harness.pd.mc.designs import AS_WRITTEN, VLLM_PULL, VLLM_PUSH
from kvspec.harness.pd.mc.model import Bounds
from kvspec.harness.pd.mc.moves import successors
from kvspec.harness.pd.mc.state import (
    KIND_NAMES,
    PH_ABORT_WAIT,
    PH_ARRIVED,
    PH_CRASHED,
    PH_NONE,
    PH_ORPHAN,
    PH_RELEASED,
    PH_RESERVED,
    PH_REVOKING,
    PH_USED,
    State,
    init_state,
)
from kvspec.harness.pd.types import Design
from kvspec.harness.vllm_sched.build import model_runner_output, tiny_model_dir

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")
nixl_push = pytest.importorskip(
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler", reason="this vLLM has no NIXL push mode"
)
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK = 16
PROMPT = 64  # four blocks
NUM_BLOCKS = 64
WATCHDOG_S = 0.05
BOUNDS = Bounds(requests=1, decoders=1, blocks=1, loss=0, dup=0, crash=0)
RID = "r0"

# --- vLLM: two real schedulers ---------------------------------------------------------------


def make_scheduler(mode: str, role: str, num_blocks: int = NUM_BLOCKS, **extra: Any) -> Scheduler:
    """vLLM's ``Scheduler`` with NIXL's scheduler side: ``mode`` push or pull, ``role`` P or D."""
    model = ModelConfig(
        model=tiny_model_dir(1024), dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=1024
    )
    cache_cfg = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True)
    cache_cfg.num_gpu_blocks = num_blocks
    sched = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=1024,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    transfer = KVTransferConfig(
        kv_connector="NixlPushConnector" if mode == "push" else "NixlConnector",
        kv_role="kv_producer" if role == "P" else "kv_consumer",
        kv_connector_extra_config=dict(extra),
    )
    init_none_hash(sha256)
    config = VllmConfig(
        model_config=model,
        cache_config=cache_cfg,
        scheduler_config=sched,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=transfer,
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )


def new_request(rid: str, params: dict[str, Any], max_tokens: int, tokens: list[int] | None = None) -> Request:
    req = Request(
        request_id=rid,
        prompt_token_ids=tokens or list(range(1, PROMPT + 1)),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )
    req.kv_transfer_params = params
    return req


def d_params(p_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """D's ``kv_transfer_params``: P's coordinates (push: known up front), or what P's
    ``request_finished`` returned (pull: the proxy forwards it)."""
    if p_params is not None:
        return dict(p_params)
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-0",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_request_id": RID,
        "tp_size": 1,
    }


P_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False}
PUSH_FORWARDED = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size")
"""What vLLM's push proxy copies from P's answer into D's request (tests/v1/kv_connector/
nixl_integration/toy_push_proxy_server.py, read at vLLM commit d1655ee): P first, D after."""


def report(sched: Scheduler, out: Any, sampled: tuple[str, ...] = (), **kv: set[str]) -> dict[int, Any]:
    """The model runner's output for ``out``: one token for each of ``sampled``, and the KV
    transfers the worker reports done (``finished_recving`` / ``finished_sending``)."""
    mro = model_runner_output(ModelRunnerOutput, list(sampled), [[7] for _ in sampled], KVConnectorOutput(**kv))
    return sched.update_from_output(out, mro)


def free_blocks(sched: Scheduler) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


class Obs(NamedTuple):
    """What can be seen after an event: D's phase for the request, P's, the messages sent."""

    d: str
    p: str
    sent: frozenset[str]


class Event(NamedTuple):
    label: str  # the model move it is
    obs: Obs


class Cluster:
    """One P and one D of ``mode``, one request ``r0``, and the events recorded so far."""

    def __init__(self, mode: str, dispatch: str = "concurrent", **d_extra: Any) -> None:
        self.mode = mode
        self.concurrent = mode == "push" and dispatch == "concurrent"
        self.P = make_scheduler(mode, "P")
        self.D = make_scheduler(mode, "D", **d_extra)
        self.p_free0, self.d_free0 = free_blocks(self.P), free_blocks(self.D)
        self.p_added = self.d_allocated = False
        self.p_params: dict[str, Any] | None = None
        self.p_finished_blocks_sent = False  # push: P's finished blocks reached its worker
        self.p_worker_registration = False  # push: D's registration is held at P's worker
        self.pending_registration: dict[str, Any] | None = None
        self.d_meta: Any = None  # D's last connector metadata
        self.p_deadline: tuple[float | None, float] = (None, 0.0)  # P's lease deadline, and its clock
        self.events: list[Event] = []

    # observations
    def d_phase(self) -> str:
        req = self.D.requests.get(RID)
        if req is None:
            if self.d_allocated:
                assert free_blocks(self.D) == self.d_free0, "D dropped the request but not its blocks"
                return "freed"
            return "none"
        if free_blocks(self.D) < self.d_free0:
            self.d_allocated = True
        if req.is_finished():
            assert free_blocks(self.D) < self.d_free0
            return "aborted-held"
        if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            return "ready" if RID in self.D.finished_recving_kv_req_ids else "waiting"
        if req.status == RequestStatus.RUNNING:
            return "running"
        return "none"  # queued, nothing allocated yet

    def p_phase(self) -> str:
        req = self.P.requests.get(RID)
        if req is None:
            return "freed" if self.p_added else "none"
        return "holding" if req.is_finished() else "queued"

    def record(self, label: str, *sent: str) -> Obs:
        obs = Obs(self.d_phase(), self.p_phase(), frozenset(sent))
        self.events.append(Event(label, obs))
        return obs

    # the router (the proxy: played by the test)
    def arrive(self) -> None:
        if self.concurrent:  # to P and D at once (the seed's router)
            self.record("r0 arrives (reserve on D0)", "Prefill", "Reserve")
        else:  # to P; D gets it once P answered (vLLM's proxies)
            self.record("r0 arrives", "Prefill")

    def abort(self) -> None:
        self.record("r0 is aborted", "Cancel", "Abort")

    def hand_to_d(self) -> None:
        assert self.p_params is not None
        self.record("deliver Prefilled(r0) to router; router picks D0", "Reserve" if self.mode == "push" else "Decode")

    # P
    def p_add(self) -> None:
        self.P.add_request(new_request(RID, dict(P_PARAMS), max_tokens=1))
        self.p_added = True
        self.record("deliver Prefill(r0) to P")

    def p_prefill(self) -> None:
        """P computes the prompt and finishes (max_tokens=1); its next step ships the finished
        blocks to its worker (push)."""
        out = self.P.schedule()
        assert out.num_scheduled_tokens.get(RID) == PROMPT
        for eco in report(self.P, out, (RID,)).values():
            for o in eco.outputs:
                if o.request_id == RID:
                    self.p_params = o.kv_transfer_params
        out = self.P.schedule()
        meta = out.kv_connector_metadata
        # Before 0.27.0 the metadata carries no scheduler clock; the deadlines are perf_counter's.
        self.p_deadline = meta.reqs_to_send.get(RID), getattr(meta, "scheduler_clock", time.perf_counter())
        report(self.P, out)
        sent: list[str] = []
        if self.mode == "pull" and self.p_params and self.p_params.get("remote_block_ids"):
            sent.append("Prefilled")  # P's response carries the KV's address to the proxy
        if self.mode == "push" and not self.concurrent and self.p_params and self.p_params.get("remote_engine_id"):
            sent.append("Prefilled")  # P's response carries its coordinates to the proxy
        if self.mode == "push" and RID in meta.push_finished_blocks:
            self.p_finished_blocks_sent = True
            if self.p_worker_registration:
                # The worker matches the blocks with the registration it holds and WRITEs
                # (push_worker.py ``_push_writer_loop``, step 3, ``_do_start_push_kv``).
                sent.append("Write")
        self.record("P prefills r0", *sent)

    def p_abort(self) -> None:
        self.P.finish_requests(RID, RequestStatus.FINISHED_ABORTED)
        out = self.P.schedule()
        report(self.P, out)
        self.record("deliver Abort(r0) to P")

    def p_worker_sent(self, label: str, *sent: str) -> None:
        """P's worker reports the request sent: its WRITE completed (push), D's read notice
        arrived (pull), or the lease ran out (``_reap_expired_send_leases``)."""
        out = self.P.schedule()
        report(self.P, out, finished_sending={RID})
        self.record(label, *sent)

    # D
    def d_schedule(self, label: str) -> Any:
        if self.mode == "pull" and RID not in self.D.requests:
            assert self.p_params is not None
            self.D.add_request(new_request(RID, d_params(self.p_params), max_tokens=4))
        out = self.D.schedule()
        meta = self.d_meta = out.kv_connector_metadata
        sent = []
        if RID in meta.push_registrations:
            sent.append("Register")
            self.pending_registration = meta.push_registrations[RID]
        recv = meta.reqs_to_recv.get(RID)
        if recv is not None and recv.remote is not None and recv.remote.block_ids:
            sent.append("Read")
        report(self.D, out)
        self.record(label, *sent)
        return out

    def d_add(self) -> None:
        params = d_params()
        if self.mode == "push" and not self.concurrent:  # the push proxy forwards P's coordinates
            assert self.p_params is not None
            params |= {k: self.p_params[k] for k in PUSH_FORWARDED}
        self.D.add_request(new_request(RID, params, max_tokens=4))

    def registration_to_p(self) -> None:
        """D's worker sends the registration; P's worker keeps it until its blocks are finished
        (push_worker.py ``_handle_push_reg_notif``: ``_pending_d_registrations``), or WRITEs
        at once when they are."""
        assert self.pending_registration is not None
        self.p_worker_registration = True
        write = self.p_finished_blocks_sent and self.p_phase() == "holding"
        self.record("deliver Register(r0@D0) to P", *(("Write",) if write else ()))

    def d_abort(self) -> None:
        self.D.finish_requests(RID, RequestStatus.FINISHED_ABORTED)
        out = self.D.schedule()  # what D's connector emits after the abort
        meta = out.kv_connector_metadata
        report(self.D, out)
        sent = ["Register"] if RID in meta.push_registrations else []
        recv = meta.reqs_to_recv.get(RID)
        if recv is not None:  # a read, or the empty one that has the worker tell P to free
            sent.append("Read" if recv.remote and recv.remote.block_ids else "Notice")
        if RID in meta.reqs_to_send:
            sent.append("Lease")
        self.record("deliver Cancel(r0@D0) to D0", *sent)

    def d_worker_recvd(self, label: str, *sent: str) -> None:
        out = self.D.schedule()
        report(self.D, out, finished_recving={RID})
        self.record(label, *sent)

    def write_completes(self) -> None:
        """Push: P's WRITE completes (its worker reports the send) and carries D's notice, which
        D's worker reports as the receive done."""
        self.p_worker_sent("deliver Write(r0@D0, from P#0) to D0", "Done")
        self.d_worker_recvd("deliver Done(r0@D0) to D0")

    def d_run(self) -> None:
        out = self.D.schedule()
        assert out.num_scheduled_tokens.get(RID, 0) > 0
        report(self.D, out, (RID,))
        self.record("D0 runs r0")


# --- the model: replay a recorded trace ------------------------------------------------------

D_PHASE = {
    PH_NONE: "none",
    PH_RESERVED: "waiting",
    PH_ARRIVED: "ready",
    PH_USED: "running",
    PH_RELEASED: "freed",
    PH_ABORT_WAIT: "aborted-held",
    PH_REVOKING: "aborted-held",
    PH_ORPHAN: "orphan",
    PH_CRASHED: "crashed",
}
P_PHASE = ("none", "queued", "holding", "freed")


def model_obs(before: State, after: State) -> Obs:
    x, q = after[3][0][0], after[2][0]
    new = Counter(after[4]) - Counter(before[4])
    return Obs(D_PHASE[x.ph], P_PHASE[q.pj], frozenset(KIND_NAMES[m[0]] for m in new))


@dataclass
class Replay:
    matched: int  # events matched (== len(trace) when the whole trace is a model path)
    violations: list[tuple[int, str]]  # (event index, rule) of the moves that broke a rule
    expected: list[tuple[str, Obs]]  # at the first unmatched event: the moves the model had

    @property
    def why(self) -> str:
        alts = "\n".join(f"  {label}: {obs}" for label, obs in self.expected)
        return f"event {self.matched} has no model move; the model could do:\n{alts}"


def replay(design: Design, trace: list[Event]) -> Replay:
    """Whether ``trace`` is a path of the model of ``design`` (every matching path is followed)."""
    states = {init_state(BOUNDS.requests, BOUNDS.decoders)}
    violations: list[tuple[int, str]] = []
    for i, ev in enumerate(trace):
        nxt, seen = set(), []
        for s in states:
            for step in successors(s, design, BOUNDS):
                obs = model_obs(s, step.state)
                seen.append((step.label, obs))
                if step.label == ev.label and obs == ev.obs:
                    nxt.add(step.state)
                    if step.violation is not None:
                        violations.append((i, step.violation[0]))
        if not nxt:
            return Replay(i, violations, sorted(set(seen)))
        states = nxt
    return Replay(len(trace), violations, [])


# --- the scenarios ---------------------------------------------------------------------------


def push_happy() -> Cluster:
    """Push: D registers at its first schedule, before P has the request; P keeps the early
    registration and WRITEs once the prefill is done; D runs after the WRITE's notice."""
    c = push_concurrent_registered()
    c.write_completes()
    c.d_run()
    return c


def push_concurrent_registered() -> Cluster:
    """The seed's router up to P's prefill: D registered before P had the request."""
    c = Cluster("push")
    c.arrive()
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    c.registration_to_p()
    c.p_add()
    c.p_prefill()
    return c


def push_sequential_happy() -> Cluster:
    """vLLM's push proxy: P first; P's answer names P; D then allocates and registers, and P,
    holding the finished blocks, WRITEs at once."""
    c = push_sequential_to_d()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    c.registration_to_p()
    c.write_completes()
    c.d_run()
    return c


def push_sequential_to_d() -> Cluster:
    """vLLM's push proxy up to D receiving the request: P prefilled and answered first."""
    c = Cluster("push", dispatch="sequential")
    c.arrive()
    c.p_add()
    c.p_prefill()
    c.hand_to_d()
    c.d_add()
    return c


def push_sequential_abort_after_prefill() -> Cluster:
    """vLLM's push proxy, the client gone once P answered: the abort finds a finished request on
    P and changes nothing there; D's registration still gets its WRITE, and D frees on it."""
    c = push_sequential_to_d()
    c.abort()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    c.p_abort()
    c.d_abort()
    c.registration_to_p()
    c.write_completes()
    return c


def push_abort_after_write() -> Cluster:
    """Push: the client aborts while D waits for the WRITE.  D holds the blocks and tells P
    nothing.  The WRITE completes, its notice reaches D, and D frees the blocks then."""
    c = push_concurrent_registered()
    c.abort()
    c.d_abort()
    c.write_completes()
    c.p_abort()  # the request is gone on P: nothing to do
    return c


def push_abort_before_prefill() -> Cluster:
    """Push: aborted before P prefilled.  P drops its queued request and never WRITEs.  D
    keeps the blocks of the aborted request, and its watchdog frees nothing (K10)."""
    c = Cluster("push", push_registration_timeout=WATCHDOG_S)
    c.arrive()
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    c.p_add()
    c.abort()
    c.d_abort()
    c.p_abort()
    c.registration_to_p()  # arrives late: P's worker finds no finished blocks, writes nothing
    time.sleep(2 * WATCHDOG_S)
    for _ in range(2):
        report(c.D, c.D.schedule())
    assert c.d_phase() == "aborted-held"
    return c


def push_abort_after_prefill() -> Cluster:
    """Push: the abort reaches P after P prefilled.  vLLM's P has already finished the
    request, so the abort changes nothing there: the WRITE and its notice go ahead."""
    c = push_concurrent_registered()
    c.abort()
    c.d_abort()
    c.p_abort()
    c.write_completes()
    return c


def pull_happy() -> Cluster:
    """Pull: P prefills and holds its KV.  The proxy hands P's params to D.  D allocates and
    reads.  D's read notice lets P free."""
    c = Cluster("pull")
    c.arrive()
    c.p_add()
    c.p_prefill()
    c.hand_to_d()
    c.d_schedule("deliver Decode(r0@D0) to D0")
    # The READ carries P's notice (pull_worker.py ``_read_blocks``, ``notif_msg``).
    c.d_worker_recvd("deliver Read(r0@D0) to D0", "ReadDone")
    c.p_worker_sent("deliver ReadDone(r0) to P")
    c.d_run()
    return c


def pull_abort_while_reading() -> Cluster:
    """Pull: aborted while D reads.  D keeps the blocks until the read is over, and P keeps
    its finished KV for the reader."""
    c = Cluster("pull")
    c.arrive()
    c.p_add()
    c.p_prefill()
    c.hand_to_d()
    c.d_schedule("deliver Decode(r0@D0) to D0")
    c.abort()
    c.d_abort()
    c.p_abort()
    c.d_worker_recvd("deliver Read(r0@D0) to D0", "ReadDone")
    c.p_worker_sent("deliver ReadDone(r0) to P")
    return c


def pull_lease_expires_while_reading() -> Cluster:
    """Pull: P's lease runs out while D still reads.  P's worker reports the send done at the
    deadline (base_worker.py ``_reap_expired_send_leases``), P frees, then D's read completes."""
    c = Cluster("pull")
    c.arrive()
    c.p_add()
    c.p_prefill()
    c.hand_to_d()
    c.d_schedule("deliver Decode(r0@D0) to D0")
    c.p_worker_sent("P's hold on r0's KV expires")
    c.d_worker_recvd("deliver Read(r0@D0) to D0", "ReadDone")
    return c


TRACES: dict[str, tuple[Callable[[], Cluster], Design]] = {
    "push-happy": (push_sequential_happy, VLLM_PUSH),
    "push-abort-after-prefill": (push_sequential_abort_after_prefill, VLLM_PUSH),
    "concurrent-push-happy": (push_happy, AS_WRITTEN),
    "concurrent-push-abort-after-write": (push_abort_after_write, AS_WRITTEN),
    "concurrent-push-abort-before-prefill": (push_abort_before_prefill, AS_WRITTEN),
    "concurrent-push-abort-after-prefill": (push_abort_after_prefill, AS_WRITTEN),
    "pull-happy": (pull_happy, VLLM_PULL),
    "pull-abort-while-reading": (pull_abort_while_reading, VLLM_PULL),
    "pull-lease-expires-while-reading": (pull_lease_expires_while_reading, VLLM_PULL),
}


@cache
def recorded(name: str) -> tuple[Event, ...]:
    return tuple(TRACES[name][0]().events)


@pytest.mark.parametrize("name", list(TRACES))
def test_vllm_trace_is_a_model_trace(name):
    design = TRACES[name][1]
    trace = list(recorded(name))
    result = replay(design, trace)
    assert result.matched == len(trace), result.why


def test_lease_expiry_trace_breaks_transfer_source_held():
    """vLLM's run with the lease ending mid-read is the model's counterexample path."""
    result = replay(VLLM_PULL, list(recorded("pull-lease-expires-while-reading")))
    assert result.matched == 7
    assert result.violations == [(6, "transfer_source_held")]


FLIPS = [
    ("concurrent-push-abort-after-write", AS_WRITTEN, {"release": "immediate"}),
    ("concurrent-push-abort-after-write", AS_WRITTEN, {"revoke": True}),
    ("concurrent-push-happy", AS_WRITTEN, {"transfer": "pull"}),
    ("concurrent-push-happy", AS_WRITTEN, {"dispatch": "sequential"}),
    ("push-happy", VLLM_PUSH, {"dispatch": "concurrent"}),
    ("push-abort-after-prefill", VLLM_PUSH, {"abort_reaches_finished_p": True}),
    ("pull-abort-while-reading", VLLM_PULL, {"defer_free_while_loading": False}),
    ("pull-happy", VLLM_PULL, {"producer_delayed_free": False}),
    ("pull-lease-expires-while-reading", VLLM_PULL, {"hold_outlives_transfers": True}),
]


@pytest.mark.parametrize(("name", "design", "change"), FLIPS, ids=[f"{n}-{next(iter(c))}" for n, _, c in FLIPS])
def test_flipped_design_does_not_replay(name, design, change):
    """The replay can fail: one decision flipped, vLLM's run is no longer a model run."""
    flipped = replace(design, **change)
    trace = list(recorded(name))
    assert replay(design, trace).matched == len(trace)
    assert replay(flipped, trace).matched < len(trace)


# --- flag by flag ----------------------------------------------------------------------------


def derive_transfer(mode: str) -> str:
    """push: D registers its blocks with P at its first schedule, P not involved yet; pull: D
    reads exactly the blocks P's ``request_finished`` named."""
    c = Cluster(mode)
    if mode == "push":
        c.d_add()
        c.d_schedule("deliver Reserve(r0@D0) to D0")
        assert RID not in c.P.requests
        reg = c.d_meta.push_registrations.get(RID)
        return "push" if reg is not None and reg["local_block_ids"] else "pull"
    c.p_add()
    c.p_prefill()
    c.d_schedule("deliver Decode(r0@D0) to D0")
    recv = c.d_meta.reqs_to_recv[RID]
    assert not c.d_meta.push_registrations
    assert c.p_params is not None
    return "pull" if tuple(recv.remote.block_ids) == tuple(c.p_params["remote_block_ids"]) else "push"


def push_waiting_then_abort() -> Cluster:
    c = Cluster("push")
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    c.d_abort()
    return c


def derive_release(mode: str) -> str:
    """immediate: D's abort while waiting for P's write frees the blocks; after_writer: they
    stay until the write's completion is reported."""
    c = push_waiting_then_abort()
    if c.events[-1].obs.d == "freed":
        return "immediate"
    c.d_worker_recvd("deliver Done(r0@D0) to D0")
    assert c.events[-1].obs.d == "freed"
    return "after_writer"


def derive_revoke(mode: str) -> bool:
    """Whether D's abort sends P anything: the connector's ``request_finished`` result, or any
    entry for the request in D's next metadata."""
    c = Cluster("push")
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    results: list[tuple[bool, Any]] = []
    for name in ("request_finished", "request_finished_all_groups"):  # record what they return
        real = getattr(c.D.connector, name)

        def spy(*args: Any, _real: Any = real) -> Any:
            results.append(_real(*args))
            return results[-1]

        setattr(c.D.connector, name, spy)
    c.D.finish_requests(RID, RequestStatus.FINISHED_ABORTED)
    assert results, "the connector was not told of the abort"
    params = [p for _, p in results if p is not None]
    out = c.D.schedule()
    meta = out.kv_connector_metadata
    names = set(meta.push_registrations) | set(meta.reqs_to_recv) | set(meta.reqs_to_send)
    beats = {r for info in meta.heartbeat_by_engine.values() for r in info.req_ids}
    return bool(params) or RID in names | beats


def derive_timeout_releases(mode: str) -> bool:
    """Whether the push watchdog (``push_registration_timeout``) releases the request's blocks
    or its wait."""
    c = Cluster("push", push_registration_timeout=WATCHDOG_S)
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    held = free_blocks(c.D)
    time.sleep(2 * WATCHDOG_S)
    for _ in range(3):
        report(c.D, c.D.schedule())
    assert RID not in c.D.connector.connector_scheduler._push_registration_deadlines  # it fired
    return free_blocks(c.D) != held or c.d_phase() != "waiting"


def derive_d_tombstones_cancelled(mode: str) -> bool:
    """An abort that reaches D before D scheduled (allocated) the request: is it never
    allocated?"""
    c = Cluster(mode)
    if mode == "pull":
        c.p_add()
        c.p_prefill()
        assert c.p_params is not None
        c.D.add_request(new_request(RID, d_params(c.p_params), max_tokens=4))
    else:
        c.d_add()
    c.D.finish_requests(RID, RequestStatus.FINISHED_ABORTED)
    for _ in range(2):
        out = c.D.schedule()
        assert RID not in out.kv_connector_metadata.push_registrations
        report(c.D, out)
    return free_blocks(c.D) == c.d_free0 and RID not in c.D.requests


def derive_wait_for_arrival(mode: str) -> bool:
    """Whether D schedules none of the request's tokens until the worker reports its KV."""
    c = Cluster(mode)
    if mode == "pull":
        c.p_add()
        c.p_prefill()
    else:
        c.d_add()
    out = c.d_schedule("deliver Reserve")
    early = out.num_scheduled_tokens.get(RID, 0)
    for _ in range(2):
        out = c.D.schedule()
        early += out.num_scheduled_tokens.get(RID, 0)
        report(c.D, out)
    c.d_worker_recvd("arrive")
    c.d_run()
    return early == 0


def derive_free_on_release(mode: str) -> bool:
    """After the delayed free of an aborted request: record gone and every block back."""
    if mode == "push":
        c = push_waiting_then_abort()
    else:
        c = Cluster("pull")
        c.p_add()
        c.p_prefill()
        c.d_schedule("deliver Decode")
        c.d_abort()
    assert c.events[-1].obs.d == "aborted-held"
    report(c.D, c.D.schedule(), finished_recving={RID})
    return RID not in c.D.requests and free_blocks(c.D) == c.d_free0


def derive_skip_d_hits(mode: str) -> bool:
    """D has the prompt's first two blocks cached: does its registration leave them out?"""
    c = Cluster("push")
    warm = new_request("warm", {}, max_tokens=1, tokens=list(range(1, 2 * BLOCK + 2)))
    c.D.add_request(warm)
    out = c.D.schedule()
    report(c.D, out, ("warm",))
    hit = c.D.kv_cache_manager.get_computed_blocks(new_request("probe", {}, 1))[0].get_block_ids()[0]
    assert len(hit) == 2
    c.d_add()
    out = c.d_schedule("deliver Reserve")
    registered = c.d_meta.push_registrations[RID]["local_block_ids"][0]
    assert len(registered) == PROMPT // BLOCK - len(hit)
    return not set(registered) & set(hit)


def derive_defer_free_while_loading(mode: str) -> bool:
    """Pull: aborted while the read is in flight, are the blocks kept until it is over?"""
    c = Cluster("pull")
    c.p_add()
    c.p_prefill()
    c.d_schedule("deliver Decode")
    c.d_abort()
    return c.events[-1].obs.d == "aborted-held"


def derive_producer_delayed_free(mode: str) -> bool:
    """P's finished request keeps its blocks, under a lease deadline, until the worker reports
    the send done."""
    c = Cluster(mode)
    c.p_add()
    c.p_prefill()
    held = c.p_phase() == "holding" and free_blocks(c.P) < c.p_free0 and c.p_deadline[0] is not None
    c.p_worker_sent("sent")
    return held and c.p_phase() == "freed" and free_blocks(c.P) == c.p_free0


def derive_hold_outlives_transfers(mode: str) -> bool:
    """Does P's hold on finished KV last as long as a transfer reads or writes it?  The
    scheduler sets a wall-clock deadline and frees on any ``finished_sending``; the worker
    reports an expired lease as sent whatever is still in flight (checked on the real
    ``_reap_expired_send_leases`` with a stub ``self``: for pull, one of one expected reader
    notices still missing; for push, a WRITE handle outstanding)."""
    c = Cluster(mode)
    c.p_add()
    c.p_prefill()
    deadline, clock = c.p_deadline
    lease = c.P.connector.connector_scheduler._kv_lease_duration
    timer = deadline is not None and abs(deadline - clock - lease) < 5
    stats = SimpleNamespace(record_kv_expired_req=lambda: None)
    worker = SimpleNamespace(
        _reqs_to_send={RID: time.perf_counter() - 1},
        _reqs_to_process={RID},
        consumer_notification_counts_by_req=Counter(),
        expected_consumer_notifications_by_req={RID: 1},
        _sending_transfers={RID: [1]},  # push: a WRITE handle not yet done
        xfer_stats=stats,
    )
    done: set[str] = set()
    if not hasattr(NixlBaseConnectorWorker, "_reap_expired_send_leases"):
        pytest.skip(f"vLLM {vllm.__version__} reaps leases inline; the derivation reads 0.31.0's reaper")
    NixlBaseConnectorWorker._reap_expired_send_leases(worker, done)  # type: ignore[arg-type]
    reaped_in_flight = RID in done
    c.p_worker_sent("sent")  # the scheduler frees on the report, D's transfer not consulted
    return not (timer and reaped_in_flight and c.p_phase() == "freed")


def two_requests_for_one(mode: str) -> Scheduler:
    """D with blocks for one request: ``a`` waits for its remote KV, then ``b`` arrives."""
    d = make_scheduler(mode, "D", num_blocks=PROMPT // BLOCK + 2)
    params = [d_params() | {"remote_request_id": r} for r in ("a", "b")]
    if mode == "pull":
        params = [p | {"remote_block_ids": ([1, 2, 3, 4],)} for p in params]
    d.add_request(new_request("a", params[0], 4))
    report(d, d.schedule())
    assert d.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    d.add_request(new_request("b", params[1], 4, tokens=list(range(500, 500 + PROMPT))))
    return d


def is_b_admitted(d: Scheduler, steps: int = 3) -> bool:
    """Whether ``b`` is allocated and registered (push) or read (pull) within ``steps`` steps."""
    admitted = False
    for _ in range(steps):
        out = d.schedule()
        meta = out.kv_connector_metadata
        admitted |= "b" in meta.push_registrations or "b" in meta.reqs_to_recv
        report(d, out)
    return admitted


def derive_reserve_within_capacity(mode: str) -> bool:
    """D has blocks for one request: a second one is neither allocated nor registered while the
    first holds them."""
    d = two_requests_for_one(mode)
    return not is_b_admitted(d) and d.requests["b"].status == RequestStatus.WAITING


def derive_queue_when_full(mode: str) -> bool:
    """The second request of ``derive_reserve_within_capacity``: queued (not refused, not
    finished), then allocated and registered (push) or read (pull) once the first is freed."""
    d = two_requests_for_one(mode)
    report(d, d.schedule())
    queued = d.requests["b"].status == RequestStatus.WAITING
    d.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    report(d, d.schedule(), finished_recving={"a"})
    return queued and "a" not in d.requests and is_b_admitted(d)


def derive_abort_reaches_finished_p(mode: str) -> bool:
    """An abort after P's prefill: does it change P's hold (push: is the send still to come)?"""
    c = Cluster(mode)
    c.p_add()
    c.p_prefill()
    held = free_blocks(c.P)
    c.p_abort()
    return not (c.p_phase() == "holding" and free_blocks(c.P) == held)


def derive_publish_on_arrival(mode: str) -> bool:
    """D's blocks become prefix-cache hits only once the KV arrived."""
    c = Cluster(mode)
    if mode == "pull":
        c.p_add()
        c.p_prefill()
    else:
        c.d_add()
    c.d_schedule("reserve")

    def hits() -> int:
        return len(c.D.kv_cache_manager.get_computed_blocks(new_request("probe", {}, 1))[0].get_block_ids()[0])

    before = hits()
    c.d_worker_recvd("arrive")
    c.d_run()
    return before == 0 and hits() > 0


DERIVED: dict[str, Callable[[str], object]] = {
    "transfer": derive_transfer,
    "release": derive_release,
    "revoke": derive_revoke,
    "timeout_releases": derive_timeout_releases,
    "d_tombstones_cancelled": derive_d_tombstones_cancelled,
    "wait_for_arrival": derive_wait_for_arrival,
    "free_on_release": derive_free_on_release,
    "skip_d_hits": derive_skip_d_hits,
    "defer_free_while_loading": derive_defer_free_while_loading,
    "producer_delayed_free": derive_producer_delayed_free,
    "hold_outlives_transfers": derive_hold_outlives_transfers,
    "reserve_within_capacity": derive_reserve_within_capacity,
    "queue_when_full": derive_queue_when_full,
    "abort_reaches_finished_p": derive_abort_reaches_finished_p,
    "publish_on_arrival": derive_publish_on_arrival,
}
PUSH_ONLY = {"release", "revoke", "timeout_releases", "skip_d_hits"}  # the model reads them for push only
PULL_ONLY = {"defer_free_while_loading", "producer_delayed_free"}  # ... for pull only
CHECKS = [
    (design, flag)
    for design in (VLLM_PUSH, VLLM_PULL, AS_WRITTEN)
    for flag in DERIVED
    if not (flag in PUSH_ONLY and not design.is_push) and not (flag in PULL_ONLY and design.is_push)
]


@cache
def derived(flag: str, mode: str) -> object:
    return DERIVED[flag](mode)


def agrees(design: Design, flag: str) -> bool:
    return derived(flag, design.transfer) == getattr(design, flag)


@pytest.mark.parametrize(("design", "flag"), CHECKS, ids=[f"{d.name}-{f}" for d, f in CHECKS])
def test_design_flag_matches_vllm(design, flag):
    assert agrees(design, flag), (
        f"{design.name}.{flag} = {getattr(design, flag)!r}, "
        f"vLLM {vllm.__version__} does {derived(flag, design.transfer)!r}"
    )


@pytest.mark.parametrize(
    ("design", "flag"),
    [
        (VLLM_PUSH, "timeout_releases"),
        (VLLM_PUSH, "revoke"),
        (VLLM_PULL, "defer_free_while_loading"),
        (VLLM_PUSH, "queue_when_full"),
        (VLLM_PULL, "abort_reaches_finished_p"),
    ],
    ids=lambda x: getattr(x, "name", x),
)
def test_flipped_flag_disagrees_with_vllm(design, flag):
    flipped = replace(design, **{flag: not getattr(design, flag)})
    assert agrees(design, flag)
    assert not agrees(flipped, flag)


def test_a_cancel_before_the_request_reaches_d_leaves_no_mark():
    """The scheduler keeps no tombstone for an abort of an id it does not know: a later
    ``add_request`` of that id is scheduled as usual.  ``d_tombstones_cancelled`` holds in
    vLLM because the proxy's abort reaches D's engine after the request it aborts (the
    queued-request case is ``derive_d_tombstones_cancelled``)."""
    c = Cluster("push")
    c.D.finish_requests(RID, RequestStatus.FINISHED_ABORTED)
    c.d_add()
    c.d_schedule("deliver Reserve(r0@D0) to D0")
    assert c.events[-1].obs == Obs("waiting", "none", frozenset({"Register"}))
