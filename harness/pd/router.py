"""The router (the central scheduler the proposal needs): it admits requests, picks the decode
instance, relays D's block ids to P, and cleans up after aborts.

Baseline (vLLM 0.33's disaggregated proxy): the request goes to P; when P reports its KV ready
(``Prefilled``) the router hands the request to a D with P's block ids (``Decode``), and D pulls.
Proposal: the request goes to P *and* a reservation to D at once (``Reserve``); the first
``Reserved`` is adopted and relayed to P (``Target``), every other attempt is cancelled.  When no
reservation can be had the router falls back to the baseline handoff.  Block ids are always
chosen by the instance that owns them: the router only relays them.
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.harness.pd import messages as M
from kvspec.harness.pd.state import ClusterState, RouterRecord, Trigger, add_trigger, send, send_to_p, with_record
from kvspec.harness.pd.types import InstanceId, LeaseId
from kvspec.spec.types import RequestId

ROUTER = "router"


def get_record(s: ClusterState, rid: RequestId) -> RouterRecord | None:
    return s.router.records.get(rid)


def is_live(rec: RouterRecord | None) -> bool:
    return rec is not None and rec.phase not in ("done", "aborted")


def pick_decoder(s: ClusterState, exclude: frozenset[InstanceId] = frozenset()) -> InstanceId | None:
    """Round robin over the decode instances not in ``exclude``."""
    names = [d.inst.name for d in s.ds]
    for k in range(len(names)):
        name = names[(s.router.next_d + k) % len(names)]
        if name not in exclude:
            return name
    return None


def _advance_round_robin(s: ClusterState) -> ClusterState:
    return replace(s, router=replace(s.router, next_d=(s.router.next_d + 1) % len(s.ds)))


def submit(s: ClusterState, rid: RequestId, prompt: tuple[int, ...], max_tokens: int) -> ClusterState:
    """A client request arrives.  Push: prefill and reservation start together."""
    assert rid not in s.router.records, f"request {rid} submitted twice"
    assert prompt and max_tokens >= 1
    rec = RouterRecord(rid, prompt, max_tokens, s.p.epoch)
    s = with_record(s, rec)
    s = send_to_p(s, ROUTER, M.Prefill(rid, prompt, s.p.epoch))
    if s.design.is_push:
        d = pick_decoder(s)
        assert d is not None
        s = reserve(_advance_round_robin(s), rid, d)
    return s


def reserve(s: ClusterState, rid: RequestId, d: InstanceId) -> ClusterState:
    """Open a reservation attempt (a fresh lease) for ``rid`` on ``d``."""
    rec = s.router.records[rid]
    lease = LeaseId(s.router.next_lease)
    s = replace(s, router=replace(s.router, next_lease=lease + 1))
    rec = replace(rec, leases={**rec.leases, lease: d}, tried=rec.tried | {d})
    s = with_record(s, rec)
    return send(s, ROUTER, d, M.Reserve(rid, lease, rec.prompt, rec.epoch, rec.max_tokens))


def retry_elsewhere(s: ClusterState, rid: RequestId) -> ClusterState:
    """A router time-out (or a second router serving the client's retry) opens another attempt
    on a decode instance not tried yet, while the first may still answer: the retry race."""
    rec = get_record(s, rid)
    if not (is_live(rec) and rec is not None and s.design.is_push and rec.phase == "prefilling"):
        return s
    if rec.adopted is not None or rec.pull:
        return s
    d = pick_decoder(s, rec.tried)
    return s if d is None else reserve(s, rid, d)


def _close_lease(rec: RouterRecord, lease: LeaseId) -> RouterRecord:
    return replace(rec, leases={k: v for k, v in rec.leases.items() if k != lease})


def on_reserved(s: ClusterState, m: M.Reserved) -> ClusterState:
    """Adopt the first reservation and relay D's block ids to P; cancel any other."""
    rec = get_record(s, m.rid)
    if rec is None:
        return s
    rec = _close_lease(rec, m.lease)
    s = with_record(s, rec)
    wanted = is_live(rec) and rec.phase == "prefilling" and rec.adopted is None and not rec.pull
    if wanted:
        s = with_record(s, replace(rec, adopted=m.lease, d=m.d))
        return send_to_p(s, ROUTER, M.Target(m.rid, m.lease, m.d, m.hit_tokens, m.blocks, rec.epoch))
    if rec.adopted == m.lease:
        return s  # a duplicate answer for the adopted lease
    if rec.phase == "aborted" and not s.design.cancel_on_abort:
        return s
    return send(s, ROUTER, m.d, M.Cancel(m.rid, m.lease))


def on_reserve_failed(s: ClusterState, m: M.ReserveFailed) -> ClusterState:
    """D is out of blocks: try another D (``retry``) or fall back to the pull handoff."""
    rec = get_record(s, m.rid)
    if rec is None or m.lease not in rec.leases:
        return s
    rec = _close_lease(rec, m.lease)
    s = with_record(s, rec)
    if not (is_live(rec) and rec.phase == "prefilling") or rec.adopted is not None or rec.leases:
        return s
    if s.options.on_reserve_fail == "retry":
        d = pick_decoder(s, rec.tried)
        if d is not None:
            return reserve(s, m.rid, d)
    return fall_back_to_pull(s, m.rid)


def fall_back_to_pull(s: ClusterState, rid: RequestId) -> ClusterState:
    rec = replace(s.router.records[rid], pull=True, adopted=None)
    s = with_record(s, rec)
    return hand_off(s, rid) if rec.prefilled is not None else s


def hand_off(s: ClusterState, rid: RequestId) -> ClusterState:
    """The baseline handoff: the request and P's block ids go to a decode instance."""
    rec = s.router.records[rid]
    assert rec.prefilled is not None
    d = pick_decoder(s)
    assert d is not None
    s = _advance_round_robin(s)
    s = with_record(s, replace(rec, phase="handed_off", d=d))
    return send(s, ROUTER, d, M.Decode(rid, rec.prompt, rec.epoch, rec.prefilled, rec.max_tokens))


def on_prefilled(s: ClusterState, m: M.Prefilled) -> ClusterState:
    """P's KV is complete and held.  Hand off now, unless a push is (still) on its way."""
    rec = get_record(s, m.rid)
    if not is_live(rec) or rec is None or rec.phase != "prefilling" or m.epoch != rec.epoch:
        return s
    rec = replace(rec, prefilled=m.blocks)
    if m.revoked is not None and rec.adopted == m.revoked:
        rec = replace(rec, adopted=None, pull=True)
    s = with_record(s, rec)
    if not s.design.is_push or rec.pull:
        return hand_off(s, m.rid)
    if rec.adopted is None and not rec.leases:
        return fall_back_to_pull(s, m.rid)
    # A Target is in flight to P, or a reservation is still being sought: keep P's KV.
    return send_to_p(s, ROUTER, M.Heartbeat(m.rid, rec.epoch))


def on_first_token(s: ClusterState, m: M.FirstToken) -> ClusterState:
    rec = get_record(s, m.rid)
    if not is_live(rec) or rec is None:
        return s
    return with_record(s, replace(rec, phase="decoding", d=m.d))


def on_finished(s: ClusterState, m: M.Finished) -> ClusterState:
    rec = get_record(s, m.rid)
    if not is_live(rec) or rec is None:
        return s
    s = with_record(s, replace(rec, phase="done"))
    return add_trigger(s, Trigger(m.rid, s.now, "finished"))


def abort(s: ClusterState, rid: RequestId, why: str = "abort") -> ClusterState:
    """The client went away (or the request failed): tell P, and cancel what D holds."""
    rec = get_record(s, rid)
    if not is_live(rec) or rec is None:
        return s
    s = with_record(s, replace(rec, phase="aborted"))
    s = add_trigger(s, Trigger(rid, s.now, why))
    pulling = rec.d is not None and (rec.pull or rec.adopted is None)
    s = send_to_p(s, ROUTER, M.Abort(rid, rec.epoch, handed_off=pulling))
    if s.design.cancel_on_abort:
        leases = dict(rec.leases)
        if rec.adopted is not None and rec.d is not None:
            leases[rec.adopted] = rec.d
        for lease, d in sorted(leases.items()):
            s = send(s, ROUTER, d, M.Cancel(rid, lease))
    if pulling and rec.d is not None:
        s = send(s, ROUTER, rec.d, M.Abort(rid))
    return s


def on_push_lost(s: ClusterState, m: M.PushLost) -> ClusterState:
    rec = get_record(s, m.rid)
    if rec is None or rec.adopted != m.lease or rec.phase != "prefilling":
        return s
    return abort(s, m.rid, "push lost")


def on_peer_failed(s: ClusterState, m: M.PeerFailed) -> ClusterState:
    """P failed: its requests that have not started decoding fail (a client retries them)."""
    for rid, rec in sorted(s.router.records.items()):
        if is_live(rec) and rec.epoch == m.epoch and rec.phase != "decoding":
            s = abort(s, rid, "prefill failed")
    return s


def deliver_to_router(s: ClusterState, msg: M.Message) -> ClusterState:
    handlers = {
        M.Reserved: on_reserved,
        M.ReserveFailed: on_reserve_failed,
        M.Prefilled: on_prefilled,
        M.FirstToken: on_first_token,
        M.Finished: on_finished,
        M.PushLost: on_push_lost,
        M.PeerFailed: on_peer_failed,
    }
    return handlers[type(msg)](s, msg)  # type: ignore[operator,no-any-return]
