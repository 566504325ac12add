"""The prefill instance (P): chunked prefill on its own manager, then the KV leaves.

Baseline (vLLM 0.33 NIXL pull): a finished request keeps its blocks (``request_finished`` returns
``delay_free_blocks``) until D's notification that it read them (``ReadDone``), or until the hold
expires unclaimed (``kv_lease_duration``; D's heartbeats claim it).  Proposal (push): once P knows
D's blocks (``Target``) it writes each block past D's prefix hit, one message per layer, as the
layers are computed (``layerwise``) or at the end; when every write has completed it tells D
(``Done``) and frees.  A ``Revoke`` stops the writes; P acknowledges once the issued ones have
completed, and tombstones the lease so a late ``Target`` cannot restart them.
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.harness.pd import instance as I
from kvspec.harness.pd import messages as M
from kvspec.harness.pd.state import (
    ClusterState,
    Computed,
    InstanceState,
    PJob,
    PushTarget,
    SourceRead,
    emit,
    send,
    with_p_job,
)
from kvspec.harness.pd.types import PREFILL, Epoch, InstanceId, Tick
from kvspec.spec.request import RequestStatus
from kvspec.spec.types import RequestId

ROUTER = "router"


def _with_inst(s: ClusterState, inst: InstanceState) -> ClusterState:
    return replace(s, p=replace(s.p, inst=inst))


def _is_current(s: ClusterState, epoch: Epoch | None) -> bool:
    """Messages for an earlier incarnation of P reach nobody."""
    return epoch == s.p.epoch


def on_prefill(s: ClusterState, m: M.Prefill) -> ClusterState:
    if not _is_current(s, m.epoch) or m.rid in s.p.jobs or m.rid in s.p.aborted:
        return s
    s = _with_inst(s, I.ensure_request(s.p.inst, m.rid, m.prompt))
    s = with_p_job(s, PJob(m.rid, m.prompt))
    s = replace(s, p=replace(s.p, queue=s.p.queue + (m.rid,)))
    early = s.p.early_targets.get(m.rid)
    if early is None:
        return s
    s = replace(s, p=replace(s.p, early_targets={r: t for r, t in s.p.early_targets.items() if r != m.rid}))
    return on_target(s, early)


def p_step(s: ClusterState) -> ClusterState:
    """One engine step: the head of the queue computes its next chunk (FCFS, one request)."""
    for rid in s.p.queue:
        job = s.p.jobs[rid]
        if job.phase in ("queued", "computing") and not job.aborted:
            return _prefill_chunk(s, job)
    return s


def _prefill_chunk(s: ClusterState, job: PJob) -> ClusterState:
    inst = s.p.inst
    rid = job.rid
    req = inst.requests[rid]
    hit = None
    if job.phase == "queued":
        inst, hit = I.lookup(inst, rid)
    start = req.num_computed_tokens + (0 if hit is None else hit.num_hit_tokens)
    n = min(s.options.chunk_tokens, len(job.prompt) - start)
    inst, new = I.allocate(inst, rid, n, hit)
    if new is None:
        if job.phase == "computing":  # vLLM preempts the request (it is P's only running one)
            inst = I.free(inst, rid)
            inst = I.set_num_computed(inst, rid, 0)
            inst = I.set_status(inst, rid, RequestStatus.PREEMPTED)
            job = replace(job, phase="queued")
        return with_p_job(_with_inst(s, inst), job)
    s = emit(_with_inst(s, inst), Computed(rid, start, inst))
    inst = I.compute(inst, rid, start, start + n, s.options.num_layers)
    inst = I.set_num_computed(inst, rid, start + n)
    if job.phase == "queued":
        inst = I.set_status(inst, rid, RequestStatus.RUNNING)
    s = _with_inst(s, inst)
    job = replace(job, phase="done" if start + n == len(job.prompt) else "computing")
    s = with_p_job(s, job)
    if job.phase == "done":
        s = replace(s, p=replace(s.p, queue=tuple(r for r in s.p.queue if r != rid)))
        return _finish(s, rid)
    return issue_writes(s, rid) if s.options.stream == "layerwise" else s


def _finish(s: ClusterState, rid: RequestId) -> ClusterState:
    """The prompt is computed (vLLM ``request_finished`` on P: max_tokens=1)."""
    job = s.p.jobs[rid]
    if job.target is not None:
        return issue_writes(s, rid)
    return report_prefilled(s, rid)


def report_prefilled(s: ClusterState, rid: RequestId) -> ClusterState:
    """No usable target: hold the KV and tell the router it can be pulled."""
    job = s.p.jobs[rid]
    table = I.get_table(s.p.inst, rid)
    s = send(s, PREFILL, ROUTER, M.Prefilled(rid, s.p.epoch, table, job.revoked))
    if not s.design.producer_delayed_free:
        return _release(s, rid)
    hold = None if job.claimed else Tick(s.now + s.options.timing.hold)
    return with_p_job(s, replace(job, reported=True, hold_until=hold))


def get_blocks_to_write(s: ClusterState, job: PJob) -> list[tuple[int, int]]:
    """(table index, layer) pairs ready to be written: past D's hit, computed, not yet issued."""
    assert job.target is not None
    bs = I.get_block_size(s.p.inst)
    computed = s.p.inst.requests[job.rid].num_computed_tokens if job.phase != "done" else len(job.prompt)
    first = job.target.hit_tokens // bs if s.design.skip_d_hits else 0
    last = -(-len(job.prompt) // bs)
    if s.options.stream == "end" and job.phase != "done":
        return []
    ready = [i for i in range(first, last) if computed >= min((i + 1) * bs, len(job.prompt))]
    return [(i, layer) for i in ready for layer in range(s.options.num_layers) if (i, layer) not in job.issued]


def issue_writes(s: ClusterState, rid: RequestId) -> ClusterState:
    job = s.p.jobs[rid]
    if job.target is None or job.aborted:
        return s
    t = job.target
    table = I.get_table(s.p.inst, rid)
    pairs = get_blocks_to_write(s, job)
    for i, layer in pairs:
        s = send(s, PREFILL, t.d, M.Write(rid, t.lease, s.p.epoch, i, layer, table[i], t.blocks[i], t.d))
    job = replace(job, issued=job.issued | set(pairs), outstanding=job.outstanding | set(pairs))
    return _settle(with_p_job(s, job), rid)


def _all_issued(s: ClusterState, job: PJob) -> bool:
    return job.phase == "done" and job.target is not None and not get_blocks_to_write(s, job)


def _settle(s: ClusterState, rid: RequestId) -> ClusterState:
    """After any change: acknowledge drained revokes, send Done, free what is no longer needed."""
    job = s.p.jobs.get(rid)
    if job is None:
        return s
    drained = not job.outstanding
    if drained and job.acks_due:
        for lease, d in job.acks_due:
            s = send(s, PREFILL, d, M.RevokeAck(rid, lease, s.p.epoch))
        job = replace(job, acks_due=())
        s = with_p_job(s, job)
    if job.aborted and drained:
        return _release(s, rid)
    ready = drained if s.design.done_after_completions else True
    if not job.done_sent and _all_issued(s, job) and ready:
        assert job.target is not None
        s = send(s, PREFILL, job.target.d, M.Done(rid, job.target.lease, s.p.epoch, job.failed))
        job = replace(job, done_sent=True)
        s = with_p_job(s, job)
    if job.done_sent and drained:
        return _release(s, rid)
    return s


def _release(s: ClusterState, rid: RequestId) -> ClusterState:
    """Free P's blocks of ``rid`` and forget it."""
    if I.holds_blocks(s.p.inst, rid):
        s = _with_inst(s, I.free(s.p.inst, rid))
    return with_p_job(s, None, rid)


def on_target(s: ClusterState, m: M.Target) -> ClusterState:
    if not _is_current(s, m.epoch):
        return s
    if m.lease in s.p.revoked and s.design.p_tombstones_revoked:
        return s
    job = s.p.jobs.get(m.rid)
    if job is None and m.rid not in s.p.aborted:  # the Target overtook the Prefill: keep it
        return replace(s, p=replace(s.p, early_targets={**s.p.early_targets, m.rid: m}))
    if job is None or job.aborted or job.target is not None:
        return s
    job = replace(job, target=PushTarget(m.lease, m.d, m.hit_tokens, m.blocks), claimed=True, hold_until=None)
    s = with_p_job(s, job)
    return issue_writes(s, m.rid) if job.phase == "done" or s.options.stream == "layerwise" else s


def on_write_done(s: ClusterState, m: M.WriteDone) -> ClusterState:
    job = s.p.jobs.get(m.rid)
    if not _is_current(s, m.epoch) or job is None:
        return s
    job = replace(job, outstanding=job.outstanding - {(m.index, m.layer)})
    if not m.ok:
        job = replace(job, failed=job.failed | {m.index})
    return _settle(with_p_job(s, job), m.rid)


def on_revoke(s: ClusterState, m: M.Revoke, d: InstanceId) -> ClusterState:
    """D wants its blocks back: stop writing, acknowledge once the issued writes completed."""
    if not _is_current(s, m.epoch):
        return s
    if s.design.p_tombstones_revoked:
        s = replace(s, p=replace(s.p, revoked=s.p.revoked | {m.lease}))
    job = s.p.jobs.get(m.rid)
    if job is None or (job.target is not None and job.target.lease != m.lease):
        s = send(s, PREFILL, d, M.RevokeAck(m.rid, m.lease, s.p.epoch))
        return send(s, PREFILL, ROUTER, M.PushLost(m.rid, m.lease)) if job is None else s
    # The Target may not have arrived yet: remember the lease either way, so that the router
    # learns (with Prefilled) that this push will not happen.
    job = replace(job, target=None, revoked=m.lease, acks_due=job.acks_due + ((m.lease, d),), claimed=False)
    s = _settle(with_p_job(s, job), m.rid)
    if job.phase == "done" and not job.aborted:
        s = report_prefilled(s, m.rid)
    return s


def on_abort(s: ClusterState, m: M.Abort) -> ClusterState:
    """Stop the request; free once no write of it is in flight.  Finished KV that the router has
    handed to a decode instance stays until that instance's ``ReadDone`` (or the hold's expiry):
    only the router knows whether a reader may still come."""
    if not _is_current(s, m.epoch):
        return s
    s = replace(s, p=replace(s.p, aborted=s.p.aborted | {m.rid}))
    job = s.p.jobs.get(m.rid)
    if job is None:
        return s
    if job.reported and job.target is None and m.handed_off:
        return s
    s = with_p_job(s, replace(job, aborted=True))
    return _settle(s, m.rid)


def on_heartbeat(s: ClusterState, m: M.Heartbeat, src: InstanceId | str) -> ClusterState:
    job = s.p.jobs.get(m.rid)
    if not _is_current(s, m.epoch) or job is None:
        return s
    if src == ROUTER:
        hold = None if job.hold_until is None else Tick(max(job.hold_until, s.now + s.options.timing.lease))
        return with_p_job(s, replace(job, hold_until=hold))
    return with_p_job(s, replace(job, claimed=True, hold_until=None))


def on_read(s: ClusterState, m: M.Read) -> ClusterState:
    """Pull: P's NIC serves D's read of one block (the data is P's memory as it is now)."""
    if not _is_current(s, m.epoch):
        return send(s, PREFILL, m.d, M.ReadData(m.rid, m.epoch, m.index, m.dst, None, ok=False))
    s = emit(s, SourceRead(m.rid, m.index, m.src, m.epoch, s.p))
    content = s.p.inst.memory.get(m.src)
    return send(s, PREFILL, m.d, M.ReadData(m.rid, m.epoch, m.index, m.dst, content))


def on_read_done(s: ClusterState, m: M.ReadDone) -> ClusterState:
    job = s.p.jobs.get(m.rid)
    if not _is_current(s, m.epoch) or job is None or job.target is not None:
        return s
    return _release(s, m.rid)


def p_tick(s: ClusterState) -> ClusterState:
    """Holds that nobody claimed expire (vLLM 0.33 NIXL ``_reap_expired_send_leases``)."""
    for rid, job in sorted(s.p.jobs.items()):
        if job.hold_until is not None and s.now >= job.hold_until and job.target is None and not job.outstanding:
            s = _release(s, rid)
    return s


def deliver_to_p(s: ClusterState, env: M.Envelope) -> ClusterState:
    msg = env.msg
    if isinstance(msg, M.Prefill):
        return on_prefill(s, msg)
    if isinstance(msg, M.Target):
        return on_target(s, msg)
    if isinstance(msg, M.Abort):
        return on_abort(s, msg)
    if isinstance(msg, M.WriteDone):
        return on_write_done(s, msg)
    if isinstance(msg, M.Revoke):
        return on_revoke(s, msg, InstanceId(str(env.src)))
    if isinstance(msg, M.Heartbeat):
        return on_heartbeat(s, msg, env.src)
    if isinstance(msg, M.Read):
        return on_read(s, msg)
    if isinstance(msg, M.ReadDone):
        return on_read_done(s, msg)
    raise AssertionError(f"P cannot receive {type(msg).__name__}")
