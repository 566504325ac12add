"""A decode instance (D): reservations (push), handoffs (pull), arrival, and its own scheduler.

Both protocols allocate the remote tokens the way vLLM 0.33's scheduler does for an asynchronous
KV load (docs/semantics.md §6): ``get_computed_blocks`` for D's own prefix hit, then
``allocate_slots(r, 0, hit, ext = prompt - hit, delay_cache_blocks=True)``, and the request waits
in WAITING_FOR_REMOTE_KVS with ``num_computed_tokens = prompt``.  On arrival D caches the valid
prefix (``cache_blocks``) and only then lowers the count to ``num_tokens - 1`` (§10.18); invalid
blocks cut the valid prefix at the first one and D recomputes the rest (§6.1, "recompute").
Pull reads are D's own, so D knows when they are over; an abort while reading frees after them
(§6).  Push writes are P's: D learns they are over only from ``Done`` (or ``RevokeAck``), so a
reservation's blocks are released only then, or after a fence has cut P off.
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.harness.pd import instance as I
from kvspec.harness.pd import messages as M
from kvspec.harness.pd.state import (
    ClusterState,
    Computed,
    DJob,
    DPhase,
    InstanceState,
    Landed,
    SourceRead,
    Trigger,
    add_trigger,
    emit,
    send,
    send_to_p,
    with_d,
    with_d_job,
)
from kvspec.harness.pd.types import InstanceId, Tick
from kvspec.spec.request import RequestStatus
from kvspec.spec.types import RequestId

ROUTER = "router"


def _name(s: ClusterState, i: int) -> InstanceId:
    return s.ds[i].inst.name


def _with_inst(s: ClusterState, i: int, inst: InstanceState) -> ClusterState:
    return with_d(s, i, replace(s.ds[i], inst=inst))


def _enqueue(s: ClusterState, i: int, job: DJob) -> ClusterState:
    s = with_d_job(s, i, job)
    d = s.ds[i]
    return s if job.rid in d.order else with_d(s, i, replace(d, order=d.order + (job.rid,)))


# --- reservations and handoffs ------------------------------------------------------------------


def _allocate_remote(s: ClusterState, i: int, job: DJob) -> tuple[ClusterState, int | None]:
    """vLLM 0.33's asynchronous-load admission: the hit adopted, blocks for the rest, nothing
    cached; returns the hit length, or None when D is out of blocks."""
    inst = I.ensure_request(s.ds[i].inst, job.rid, job.prompt)
    inst, hit = I.lookup(inst, job.rid)
    ext = len(job.prompt) - hit.num_hit_tokens
    inst, new = I.allocate(inst, job.rid, 0, hit, ext, delay_cache_blocks=s.design.publish_on_arrival)
    if new is None:
        return _with_inst(s, i, inst), None
    inst = I.set_status(inst, job.rid, RequestStatus.WAITING_FOR_REMOTE_KVS)
    inst = I.set_num_computed(inst, job.rid, len(job.prompt))
    return _with_inst(s, i, inst), int(hit.num_hit_tokens)


def on_reserve(s: ClusterState, i: int, m: M.Reserve) -> ClusterState:
    d = s.ds[i]
    if ((m.rid, m.lease) in d.cancelled and s.design.d_tombstones_cancelled) or m.rid in d.aborted:
        return s
    job = d.jobs.get(m.rid)
    if job is not None:
        if job.lease == m.lease and job.phase == "reserved":  # a duplicate Reserve: answer again
            table = I.get_table(d.inst, m.rid)
            return send(s, _name(s, i), ROUTER, M.Reserved(m.rid, m.lease, _name(s, i), job.hit_tokens, table))
        if job.lease == m.lease:
            return s
        return send(s, _name(s, i), ROUTER, M.ReserveFailed(m.rid, m.lease, _name(s, i)))  # one lease per request
    job = DJob(m.rid, m.prompt, m.max_tokens, "push", "queued", m.epoch, lease=m.lease)
    if m.epoch in d.fenced:
        return send(s, _name(s, i), ROUTER, M.ReserveFailed(m.rid, m.lease, _name(s, i)))
    return try_reserve(s, i, job, answer_failure=s.options.on_reserve_fail != "queue")


def try_reserve(s: ClusterState, i: int, job: DJob, answer_failure: bool) -> ClusterState:
    s, hit = _allocate_remote(s, i, job)
    if hit is None:
        if answer_failure:
            return send(s, _name(s, i), ROUTER, M.ReserveFailed(job.rid, job.lease or 0, _name(s, i)))  # type: ignore[arg-type]
        return _enqueue(s, i, job)  # queue for blocks; retried every step
    table = I.get_table(s.ds[i].inst, job.rid)
    phase: DPhase = "reserved" if s.design.wait_for_arrival else "arrived"
    job = replace(job, phase=phase, hit_tokens=hit, deadline=Tick(s.now + s.options.timing.lease))
    s = _enqueue(s, i, job)
    return send(s, _name(s, i), ROUTER, M.Reserved(job.rid, job.lease, _name(s, i), hit, table))  # type: ignore[arg-type]


def on_decode(s: ClusterState, i: int, m: M.Decode) -> ClusterState:
    """The pull handoff: claim P's KV (heartbeat), then allocate and read when blocks allow."""
    d = s.ds[i]
    job = d.jobs.get(m.rid)
    if job is not None and job.phase == "revoking":  # the push fell back to pull: wait for the release
        return with_d(s, i, replace(d, handoffs={**d.handoffs, m.rid: m}))
    if m.rid in d.aborted or job is not None:
        return s
    s = send_to_p(s, _name(s, i), M.Heartbeat(m.rid, m.epoch))
    job = DJob(m.rid, m.prompt, m.max_tokens, "pull", "queued", m.epoch, p_blocks=m.blocks)
    return try_load(_enqueue(s, i, job), i, job)


def try_load(s: ClusterState, i: int, job: DJob) -> ClusterState:
    s, hit = _allocate_remote(s, i, job)
    if hit is None:
        return s
    bs = I.get_block_size(s.ds[i].inst)
    table = I.get_table(s.ds[i].inst, job.rid)
    wanted = frozenset(range(hit // bs, len(table)))
    job = replace(job, phase="loading", hit_tokens=hit, outstanding=wanted)
    if job.epoch in s.ds[i].fenced:
        return with_d_job(s, i, replace(job, phase="arrived", outstanding=frozenset(), failed=wanted))
    for k in sorted(wanted):
        s = send_to_p(s, _name(s, i), M.Read(job.rid, job.epoch, k, job.p_blocks[k], table[k], _name(s, i)))
    return with_d_job(s, i, job)


# --- the data plane -----------------------------------------------------------------------------


def on_write(s: ClusterState, i: int, m: M.Write) -> ClusterState:
    """A one-sided write lands whatever D's software thinks: D's bookkeeping is not consulted."""
    if m.epoch in s.ds[i].fenced:
        return s  # the fence tore the connection down: nothing more lands
    if m.ok:
        live = s.p.epoch == m.epoch
        if live:
            s = emit(s, SourceRead(m.rid, m.index, m.src, m.epoch, s.p))
        content = s.p.inst.memory.get(m.src) if live else None
        s = emit(s, Landed("write", m.rid, m.lease, m.index, m.dst, s.ds[i]))
        s = _with_inst(s, i, I.land(s.ds[i].inst, m.dst, content, frozenset({m.layer})))
    return send_to_p(s, _name(s, i), M.WriteDone(m.rid, m.lease, m.epoch, m.index, m.layer, m.ok))


def on_read_data(s: ClusterState, i: int, m: M.ReadData) -> ClusterState:
    if m.epoch in s.ds[i].fenced:
        return s
    if m.ok:
        s = emit(s, Landed("read", m.rid, None, m.index, m.dst, s.ds[i]))
        layers = I.all_layers(s.options.num_layers)
        s = _with_inst(s, i, I.land(s.ds[i].inst, m.dst, m.content, layers))
    job = s.ds[i].jobs.get(m.rid)
    if job is None or job.phase != "loading" or m.index not in job.outstanding:
        return s
    job = replace(job, outstanding=job.outstanding - {m.index}, failed=job.failed | (set() if m.ok else {m.index}))
    s = with_d_job(s, i, job)
    return _maybe_loaded(s, i, job)


def _maybe_loaded(s: ClusterState, i: int, job: DJob) -> ClusterState:
    """Every read is over: tell P (it may free), then free here too if the request was aborted."""
    if job.outstanding:
        return s
    s = send_to_p(s, _name(s, i), M.ReadDone(job.rid, job.epoch))
    job = replace(job, phase="arrived")
    s = with_d_job(s, i, job)
    return release(s, i, job.rid) if job.aborted else s


def on_done(s: ClusterState, i: int, m: M.Done) -> ClusterState:
    job = s.ds[i].jobs.get(m.rid)
    if m.epoch in s.ds[i].fenced or job is None or job.lease != m.lease:
        return s
    if job.phase == "reserved":
        return with_d_job(s, i, replace(job, phase="arrived", failed=m.failed))
    if job.phase == "revoking":  # the writer is done with the blocks: as good as an ack
        return release(s, i, m.rid)
    return s


# --- releasing ----------------------------------------------------------------------------------


def release(s: ClusterState, i: int, rid: RequestId) -> ClusterState:
    """Free ``rid``'s blocks here and forget it (a cancelled lease stays tombstoned)."""
    d = s.ds[i]
    job = d.jobs.get(rid)
    if s.design.free_on_release and I.holds_blocks(d.inst, rid):
        s = _with_inst(s, i, I.free(d.inst, rid))
    s = with_d_job(s, i, None, rid)
    if job is not None and job.lease is not None:
        s = with_d(s, i, replace(s.ds[i], cancelled=s.ds[i].cancelled | {(rid, job.lease)}))
    handoff = s.ds[i].handoffs.get(rid)
    if handoff is not None:
        s = with_d(s, i, replace(s.ds[i], handoffs={r: h for r, h in s.ds[i].handoffs.items() if r != rid}))
        s = on_decode(s, i, handoff)
    return s


def revoke_or_release(s: ClusterState, i: int, job: DJob) -> ClusterState:
    """A reservation whose KV has not arrived is given up.  Its blocks may still be written, so
    (amended design) D asks P to stop and waits for the acknowledgement; the proposal as written
    frees them at once."""
    if job.phase != "reserved":
        return release(s, i, job.rid) if job.phase != "revoking" else s
    if s.design.release == "immediate":
        return release(s, i, job.rid)
    s = with_d_job(s, i, replace(job, phase="revoking"))
    return send_to_p(s, _name(s, i), M.Revoke(job.rid, job.lease, job.epoch))  # type: ignore[arg-type]


def on_cancel(s: ClusterState, i: int, m: M.Cancel) -> ClusterState:
    job = s.ds[i].jobs.get(m.rid)
    if job is None or job.lease != m.lease:
        if s.design.d_tombstones_cancelled:
            s = with_d(s, i, replace(s.ds[i], cancelled=s.ds[i].cancelled | {(m.rid, m.lease)}))
        return s
    return revoke_or_release(s, i, job)


def on_revoke_ack(s: ClusterState, i: int, m: M.RevokeAck) -> ClusterState:
    job = s.ds[i].jobs.get(m.rid)
    if m.epoch in s.ds[i].fenced or job is None or job.lease != m.lease or job.phase != "revoking":
        return s
    return release(s, i, m.rid)


def on_abort(s: ClusterState, i: int, m: M.Abort) -> ClusterState:
    d = s.ds[i]
    job = d.jobs.get(m.rid)
    if job is None:
        return with_d(s, i, replace(d, aborted=d.aborted | {m.rid}))
    if job.mode == "push" and job.phase in ("queued", "reserved", "revoking"):
        return revoke_or_release(s, i, job)
    if job.phase == "loading" and s.design.defer_free_while_loading:
        return with_d_job(s, i, replace(job, aborted=True))  # vLLM 0.33: free once the reads are over
    if job.mode == "pull" and job.phase == "queued":  # vLLM 0.33 NIXL: an empty notification frees P
        s = send_to_p(s, _name(s, i), M.ReadDone(job.rid, job.epoch))
    return release(s, i, m.rid)


def on_peer_failed(s: ClusterState, i: int, m: M.PeerFailed) -> ClusterState:
    """P incarnation ``epoch`` was declared failed; it may still be sending.  Fence it first (drop
    whatever of it is in flight to this D: a torn-down connection), then nothing of it can land,
    and its reservations can be released and its reads counted as failed."""
    if not s.design.fence_on_peer_failure:
        return s
    name = _name(s, i)
    d = s.ds[i]
    s = with_d(s, i, replace(d, fenced=d.fenced | {m.epoch}))
    network = tuple(
        e for e in s.network if not (e.dst == name and getattr(e.msg, "epoch", None) == m.epoch and e.src != ROUTER)
    )
    s = replace(s, network=network)
    for rid, job in sorted(s.ds[i].jobs.items()):
        if job.epoch != m.epoch:
            continue
        if job.mode == "push" and job.phase in ("queued", "reserved", "revoking"):
            s = release(s, i, rid)
        elif job.phase == "loading":
            job = replace(job, failed=job.failed | job.outstanding, outstanding=frozenset())
            s = with_d_job(s, i, job)
            s = _maybe_loaded(s, i, job)
    return s


def d_tick(s: ClusterState, i: int) -> ClusterState:
    """Reservation time-outs (vLLM 0.33 push mode has a registration watchdog of this kind)."""
    for rid, job in sorted(s.ds[i].jobs.items()):
        if job.phase == "reserved" and job.deadline is not None and s.now >= job.deadline:
            inc = s.ds[i].inst.incarnation.get(rid)
            s = add_trigger(s, Trigger(rid, s.now, "lease time-out", _name(s, i), inc))
            s = revoke_or_release(s, i, job)
    return s


def deliver_to_d(s: ClusterState, i: int, env: M.Envelope) -> ClusterState:
    msg = env.msg
    handlers = {
        M.Reserve: on_reserve,
        M.Decode: on_decode,
        M.Write: on_write,
        M.ReadData: on_read_data,
        M.Done: on_done,
        M.Cancel: on_cancel,
        M.RevokeAck: on_revoke_ack,
        M.Abort: on_abort,
        M.PeerFailed: on_peer_failed,
    }
    handler = handlers.get(type(msg))
    if handler is None:
        raise AssertionError(f"D cannot receive {type(msg).__name__}")
    return handler(s, i, msg)  # type: ignore[operator,no-any-return]


__all__ = ["Computed", "deliver_to_d", "d_tick", "release", "try_load", "try_reserve"]
