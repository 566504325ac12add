"""The protocols' transitions over ``state``, and the safety rules each transition is judged by.

One function per role's reaction, named after the message or step (the fuzzed model of
``harness.pd`` has the same roles, the same messages and the same ``Design`` decisions, with
the spec manager, block contents and time in place of this model's abstractions).  Time is not
modelled: a time-out (a reservation's watchdog, P's hold on its KV) may fire at any moment,
which covers every timing.  Faults: a control message may be lost or duplicated (budgets), any
message may be delivered in any order, a transfer may fail (error completion, nothing lands),
and one instance (P or a D) may crash within the crash budget.

``moves.successors`` lists every move; a move that breaks a rule of ``SAFETY`` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.harness.pd.mc.state import (
    ABORT,
    ACK,
    CANCEL,
    DECODE,
    DONE,
    HELD,
    P_ABORTED,
    P_DONE_SENT,
    P_FAILED,
    P_ISSUED,
    PH_ABORT_WAIT,
    PH_ARRIVED,
    PH_NONE,
    PH_ORPHAN,
    PH_RELEASED,
    PH_RESERVED,
    PH_REVOKING,
    PH_USED,
    PREFILL,
    PREFILLED,
    READ,
    READDONE,
    REG,
    RESERVE,
    REVOKE,
    RFAIL,
    WRITE,
    Msg,
    Res,
    State,
    describe,
)
from kvspec.harness.pd.types import Design

SAFETY = {
    "write_lands_in_held_block": "every write lands in a block D holds for that transfer at that moment",
    "transfer_source_held": "a transfer reads P's KV only while P still holds it",
    "published_only_after_arrival": "D takes a reservation's KV as complete only when every write has landed",
    "read_only_after_arrival": "D runs a request only on KV that arrived (or that it recomputes)",
    "instance_conservation": "every block D holds belongs to a live reservation record",
    "blocks_within_capacity": "D never holds more reservations than it has blocks (no block serves two transfers)",
}


@dataclass(frozen=True, slots=True)
class Bounds:
    requests: int = 1
    decoders: int = 2
    blocks: int = 1  # per decode instance
    loss: int = 1
    dup: int = 1
    crash: int = 1


FAULTS = Bounds()
"""One request against every fault: two decode instances, a lost and a duplicated control message,
a crash of P or of a D."""
CONTENTION = Bounds(requests=2, decoders=1, blocks=1, loss=0, dup=0, crash=0)
"""Two requests contending for one decode instance's only block, with no fault: a refused
reservation, a block released by one request and taken by the other, a late transfer of the first
landing after the second took the block.  With one lost message as well the proposal's search
completes too (1,022,422 states, 3 minutes, 1.8 GB: docs/pd-preallocation.md); with a duplicate or
a crash it passes 1.5 million states."""
PRESETS = {"faults": FAULTS, "contention": CONTENTION}


class W:
    """A mutable working copy of a state (one transition's edits)."""

    def __init__(self, s: State, blocks: int) -> None:
        self.blocks = blocks
        pe, dinc, reqs, res, net, lost, dup, crashed, fb = s
        self.pe, self.dinc, self.reqs = pe, list(dinc), list(reqs)
        self.res = [list(row) for row in res]
        self.net, self.lost, self.dup, self.crashed, self.fb = list(net), lost, dup, crashed, fb
        self.violation: tuple[str, str] | None = None

    def send(self, m: Msg) -> None:
        self.net.append(m)

    def flag(self, rule: str, why: str) -> None:
        if self.violation is None:
            self.violation = (rule, why)

    def freeze(self) -> State:
        res = tuple(tuple(row) for row in self.res)
        return (
            self.pe,
            tuple(self.dinc),
            tuple(self.reqs),
            res,
            tuple(sorted(self.net)),
            self.lost,
            self.dup,
            self.crashed,
            self.fb,
        )


def count_held(row: Sequence[Res]) -> int:
    """Blocks a decode instance holds: one per reservation in a held phase (``row`` = its records)."""
    return sum(1 for x in row if x.ph in HELD)


def is_new_reservation(x: Res, g: Design) -> bool:
    """Delivering a Reserve (or Decode) to a record ``x`` would allocate: nothing reserved yet,
    and no Cancel got there first."""
    return x.ph == PH_NONE and not (x.tomb and g.d_tombstones_cancelled)


# --- the router ------------------------------------------------------------------------------


def is_concurrent(g: Design) -> bool:
    """The router reserves on D when the request arrives (push dispatched to P and D at once)."""
    return g.is_push and g.dispatch == "concurrent"


def arrive(w: W, g: Design, r: int, d: int) -> None:
    """A request arrives: to P, and (concurrent push) a reservation on ``d`` at the same time;
    otherwise D gets it once P answered (``Prefilled``)."""
    w.send((PREFILL, r, 0, w.pe, 0))
    if is_concurrent(g):
        w.reqs[r] = w.reqs[r]._replace(rph=1, rd=d, tried=1 << d)
        w.send((RESERVE, r, d, w.pe, 0))
    else:
        w.reqs[r] = w.reqs[r]._replace(rph=1)


def abort(w: W, g: Design, r: int) -> None:
    q = w.reqs[r]
    w.reqs[r] = q._replace(rph=2)
    if g.cancel_on_abort and q.rd >= 0:
        w.send((CANCEL, r, q.rd, 0, 0))
    w.send((ABORT, r, 0, w.pe, 0))


def hand_to(w: W, g: Design, r: int, d: int, epoch: int) -> None:
    """Reserve on (push) or hand off to (pull) decode instance ``d``."""
    q = w.reqs[r]
    w.reqs[r] = q._replace(rd=d, tried=q.tried | 1 << d)
    w.send((RESERVE, r, d, epoch, 0) if g.is_push else (DECODE, r, d, epoch, 0))


# --- the prefill instance --------------------------------------------------------------------


def issue_transfers(w: W, g: Design, r: int) -> None:
    """P has its KV and a target: write every block past D's hit (push)."""
    q = w.reqs[r]
    if q.pj != 2 or not q.ptgt or q.pfl & (P_ABORTED | P_ISSUED):
        return
    d, di, hit = q.ptgt
    n = 1
    w.send((WRITE, r, d, di, 2 * w.pe))
    if hit and not g.skip_d_hits:
        w.send((WRITE, r, d, di, 2 * w.pe + 1))
        n = 2
    fl = q.pfl | P_ISSUED
    if not g.done_after_completions:
        w.send((DONE, r, d, di, 0))
        fl |= P_DONE_SENT
    w.reqs[r] = q._replace(pout=n, pfl=fl)


def settle(w: W, g: Design, r: int) -> None:
    """After a completion: acknowledge drained revokes, send Done, free what nobody needs."""
    q = w.reqs[r]
    if q.pout:
        return
    for d, di in q.pack:
        w.send((ACK, r, d, di, w.pe))
    q = q._replace(pack=())
    if q.pj == 2 and q.pfl & P_ABORTED and g.is_push:
        q = q._replace(pj=3)
    elif q.pj == 2 and q.pfl & P_ISSUED and q.ptgt:
        if not q.pfl & P_DONE_SENT:
            w.send((DONE, r, q.ptgt[0], q.ptgt[1], 1 if q.pfl & P_FAILED else 0))
        q = q._replace(pj=3, pfl=q.pfl | P_DONE_SENT)
    w.reqs[r] = q


def p_step(w: W, g: Design, r: int) -> None:
    """P computes the prompt (vLLM ``request_finished`` on P follows)."""
    w.reqs[r] = w.reqs[r]._replace(pj=2)
    if g.is_push:
        if not is_concurrent(g):
            w.send((PREFILLED, r, 0, w.pe, 0))  # P's answer carries its coordinates to the proxy
        issue_transfers(w, g, r)
    else:
        w.send((PREFILLED, r, 0, w.pe, 0))
        if not g.producer_delayed_free:
            w.reqs[r] = w.reqs[r]._replace(pj=3)


def is_reader_coming(w: W, r: int) -> bool:
    """A handoff, a registration or a read of ``r`` is on its way, or a decode instance waits
    for its KV (what a long-enough lease waits out)."""
    if any(m[1] == r and m[0] in (PREFILLED, DECODE, RESERVE, REG, READ, RFAIL) for m in w.net):
        return True
    return any(row[r].ph in (PH_RESERVED, PH_ABORT_WAIT) for row in w.res)


def can_expire_hold(w: W, g: Design, r: int) -> bool:
    q = w.reqs[r]
    if q.pj != 2:
        return False
    if not g.hold_outlives_transfers:
        return True  # vLLM 0.33: the lease frees the KV even with a transfer reading it
    if g.is_push:
        return q.pout == 0 and not q.ptgt and not is_reader_coming(w, r)
    return not is_reader_coming(w, r)


def on_p_message(w: W, g: Design, m: Msg) -> None:
    kind, r, d, a, b = m
    q = w.reqs[r]
    if kind == PREFILL:
        if a == w.pe and q.pj == 0 and not q.pfl & P_ABORTED:
            w.reqs[r] = q._replace(pj=1)
    elif kind == REG:
        if q.ptomb >> d & 1 and g.p_tombstones_revoked:
            return
        if q.pj == 3 or q.pfl & P_ABORTED:
            if g.revoke and q.pout:  # nothing more will be written: D may free once the rest completed
                w.reqs[r] = q._replace(pack=tuple(sorted(set(q.pack) | {(d, a)})))
            elif g.revoke:
                w.send((ACK, r, d, a, w.pe))
        elif not q.ptgt:  # kept even before the Prefill (vLLM 0.33 push keeps early registrations)
            w.reqs[r] = q._replace(ptgt=(d, a, b))
            issue_transfers(w, g, r)
    elif kind == REVOKE:
        if a != w.pe:
            return
        if g.p_tombstones_revoked:
            q = q._replace(ptomb=q.ptomb | 1 << d)
        if q.ptgt and q.ptgt[0] == d and q.ptgt[1] == b:
            q = q._replace(ptgt=())
        if q.pout:  # acknowledge only once no write of the request is outstanding
            q = q._replace(pack=tuple(sorted(set(q.pack) | {(d, b)})))
        else:
            w.send((ACK, r, d, b, w.pe))
        w.reqs[r] = q
    elif kind == ABORT:
        if a != w.pe or (q.pj >= 2 and not g.abort_reaches_finished_p):
            return  # vLLM: the request already finished on P; its lease keeps the KV for D
        q = q._replace(pfl=q.pfl | P_ABORTED)
        if q.ptgt and g.revoke:  # tell the registered D that nothing (more) will be written
            q = q._replace(pack=tuple(sorted(set(q.pack) | {(q.ptgt[0], q.ptgt[1])})), ptgt=())
        if q.pj == 1 or (q.pj == 2 and g.is_push and q.pout == 0):
            q = q._replace(pj=3)  # pull: finished KV stays for a reader that may come
        w.reqs[r] = q
        settle(w, g, r)
    elif kind == READDONE:
        if a == w.pe and q.pj == 2:
            w.reqs[r] = q._replace(pj=3)


def complete_at_p(w: W, g: Design, r: int, epoch: int, ok: bool) -> None:
    """The NIC's completion of one of P's transfers (to P's current incarnation only)."""
    q = w.reqs[r]
    if epoch != w.pe or q.pout == 0:
        return
    w.reqs[r] = q._replace(pout=q.pout - 1, pfl=q.pfl | (0 if ok else P_FAILED))
    settle(w, g, r)


def is_source_held(w: W, r: int, epoch: int) -> bool:
    return epoch != w.pe or w.reqs[r].pj == 2  # a failed-but-slow P's memory is its own


# --- the decode instances --------------------------------------------------------------------


def release(w: W, g: Design, d: int, r: int) -> None:
    x = w.res[d][r]
    w.res[d][r] = x._replace(ph=PH_RELEASED if g.free_on_release else PH_ORPHAN)


def cancel_or_expire(w: W, g: Design, d: int, r: int) -> None:
    """An abort's Cancel, or the reservation's watchdog, on a reservation not yet used."""
    x = w.res[d][r]
    if x.ph == PH_ARRIVED:
        release(w, g, d, r)
    elif x.ph != PH_RESERVED:
        return
    elif not g.is_push:
        if g.defer_free_while_loading:
            w.res[d][r] = x._replace(ph=PH_ABORT_WAIT)  # vLLM 0.33: freed when the reads are over
        else:
            release(w, g, d, r)
    elif g.release == "immediate":
        release(w, g, d, r)
    elif not g.revoke:
        w.res[d][r] = x._replace(ph=PH_ABORT_WAIT)  # vLLM 0.33: freed on P's completion notice
    else:
        w.res[d][r] = x._replace(ph=PH_REVOKING)
        w.send((REVOKE, r, d, x.pe, w.dinc[d]))


def reserve(w: W, g: Design, m: Msg, hit: int) -> None:
    """vLLM 0.33 ``allocate_slots(..., delay_cache_blocks=True)`` for the remote tokens."""
    kind, r, d, a, _ = m
    x = w.res[d][r]
    if not is_new_reservation(x, g):
        return
    if a < w.fb and g.fence_on_peer_failure:  # for a P incarnation D has fenced: refuse
        w.send((RFAIL, r, d, a, 0))
        return
    if count_held(w.res[d]) >= w.blocks and g.reserve_within_capacity:
        w.send((RFAIL, r, d, a, 0))
        return
    w.res[d][r] = x._replace(ph=PH_RESERVED, hit=hit, pe=a)
    if count_held(w.res[d]) > w.blocks:
        w.flag("blocks_within_capacity", f"D{d} reserves for r{r} with all {w.blocks} block(s) held")
    w.send((REG, r, d, w.dinc[d], hit) if kind == RESERVE else (READ, r, d, w.dinc[d], a))


def land(w: W, g: Design, m: Msg, ok: bool) -> None:
    """A Write or a Read reaches D's memory (``ok``) or fails with an error completion."""
    kind, r, d, di, b = m
    epoch = b >> 1 if kind == WRITE else b
    hit = b & 1 if kind == WRITE else 0
    x = w.res[d][r]
    fenced = (di != w.dinc[d] and g.fence_restarted_d) or (epoch < w.fb and g.fence_on_peer_failure)
    if ok and not fenced:
        if not is_source_held(w, r, epoch):
            w.flag("transfer_source_held", f"{describe(m)} reads r{r}'s KV on P after P freed it")
        if hit:
            w.flag("write_lands_in_held_block", f"{describe(m)} overwrites D{d}'s shared prefix-hit block")
        elif di != w.dinc[d] or x.ph not in (PH_RESERVED, PH_REVOKING, PH_ABORT_WAIT, PH_ARRIVED):
            state = "a restarted instance's block" if di != w.dinc[d] else f"a block in phase {x.ph}"
            w.flag("write_lands_in_held_block", f"{describe(m)} lands in {state}, not held for it")
        else:
            w.res[d][r] = x = x._replace(landed=1)
    if kind == WRITE:
        complete_at_p(w, g, r, epoch, ok and not fenced)
        return
    if di != w.dinc[d]:
        return
    if x.ph == PH_RESERVED:
        w.res[d][r] = x._replace(ph=PH_ARRIVED, told=0 if ok and not fenced else 1)
    elif x.ph == PH_ABORT_WAIT:
        release(w, g, d, r)
    w.send((READDONE, r, 0, epoch, 0))


def on_d_message(w: W, g: Design, m: Msg) -> None:
    kind, r, d, a, b = m
    x = w.res[d][r]
    if kind == CANCEL:
        if x.ph == PH_NONE:
            w.res[d][r] = x._replace(tomb=1)
        else:
            cancel_or_expire(w, g, d, r)
    elif kind == DONE and a == w.dinc[d]:
        if x.ph == PH_RESERVED:
            if any(n[0] == WRITE and n[1] == r and n[2] == d and n[3] == a and not n[4] & 1 for n in w.net):
                w.flag("published_only_after_arrival", f"D{d} takes r{r}'s KV as arrived with a write in flight")
            w.res[d][r] = x._replace(ph=PH_ARRIVED, told=b)
        elif x.ph in (PH_REVOKING, PH_ABORT_WAIT):
            release(w, g, d, r)
    elif kind == ACK and a == w.dinc[d] and x.ph in (PH_RESERVED, PH_REVOKING):
        if b == x.pe or not g.ack_names_incarnation:  # another incarnation speaks not for this one's writes
            release(w, g, d, r)


def use(w: W, d: int, r: int) -> None:
    """D schedules the request: its forward pass reads the KV."""
    x = w.res[d][r]
    if not (x.landed or x.told):
        w.flag("read_only_after_arrival", f"D{d} runs r{r} before its KV arrived")
    w.res[d][r] = x._replace(ph=PH_USED)
