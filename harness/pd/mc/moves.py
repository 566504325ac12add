"""Every move of the abstract cluster from one state: the roles' steps, message delivery (any
message in flight, in any order), time-outs (at any moment) and the faults within their budgets.

``successors`` lists ``Step(label, kind, state, violation)``; ``kind`` is ``"step"`` (the
protocol's own moves), ``"timeout"`` or ``"fault"``; ``violation`` names the rule of
``model.SAFETY`` the move broke.  Partial-order reduction is not applied: every interleaving is
a separate path (only symmetry is reduced, in ``search``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from kvspec.harness.pd.mc.model import (
    Bounds,
    W,
    abort,
    arrive,
    can_expire_hold,
    cancel_or_expire,
    count_held,
    hand_to,
    is_concurrent,
    is_new_reservation,
    land,
    on_d_message,
    on_p_message,
    p_step,
    release,
    reserve,
    use,
)
from kvspec.harness.pd.mc.state import (
    ACK,
    DATA,
    DECODE,
    HELD,
    P_ABORTED,
    PH_ABORT_WAIT,
    PH_ARRIVED,
    PH_CRASHED,
    PH_ORPHAN,
    PH_RESERVED,
    PH_REVOKING,
    PREFILLED,
    READ,
    RESERVE,
    REVOKE,
    RFAIL,
    TO_P,
    WRITE,
    Msg,
    State,
    describe,
)
from kvspec.harness.pd.types import Design


class Step(NamedTuple):
    label: str
    kind: str
    state: State
    violation: tuple[str, str] | None


Go = Callable[..., Step]


# --- faults ----------------------------------------------------------------------------------


def expire_hold(w: W, r: int) -> None:
    w.reqs[r] = w.reqs[r]._replace(pj=3)


def lose(w: W, m: Msg) -> None:
    w.net.remove(m)
    w.lost += 1


def duplicate(w: W, m: Msg) -> None:
    w.send(m)
    w.dup += 1


def crash_p(w: W) -> None:
    """P crashes and restarts empty.  Until the failure detector fences the old incarnation
    (``fence_p``, a later move), its transfers in flight still land."""
    w.pe += 1
    w.reqs = [q._replace(pj=0, ptgt=(), pout=0, pfl=0, ptomb=0, pack=()) for q in w.reqs]
    w.crashed += 1


def fence_p(w: W, g: Design) -> None:
    """The failure detector tells the decode instances of P's crash: they fence every older
    incarnation (its transfers in flight are dropped: torn-down connections) and release what
    waited for it."""
    w.fb = w.pe
    w.net = [m for m in w.net if not (m[0] == WRITE and m[4] >> 1 < w.fb) and not (m[0] == READ and m[4] < w.fb)]
    for d, row in enumerate(w.res):
        for r, x in enumerate(row):
            if x.pe < w.fb and x.ph in (PH_RESERVED, PH_REVOKING, PH_ABORT_WAIT):
                release(w, g, d, r)


def crash_d(w: W, d: int) -> None:
    w.dinc[d] += 1
    w.res[d] = [x._replace(ph=PH_CRASHED) if x.ph in HELD else x._replace(tomb=0) for x in w.res[d]]
    w.crashed += 1


def successors(s: State, g: Design, bounds: Bounds) -> Iterator[Step]:
    base = W(s, bounds.blocks)

    def go(label: str, kind: str, fn: Callable[..., object], *args: object) -> Step:
        w = W(s, bounds.blocks)
        fn(w, *args)
        for d, row in enumerate(w.res):
            for r, x in enumerate(row):
                if x.ph == PH_ORPHAN:
                    w.flag("instance_conservation", f"D{d} forgot r{r}'s reservation but still holds its block")
        return Step(label, kind, w.freeze(), w.violation)

    nd = len(base.dinc)
    for r, q in enumerate(base.reqs):
        if q.rph == 0:
            for d in range(nd) if is_concurrent(g) else (0,):
                yield go(f"r{r} arrives" + (f" (reserve on D{d})" if is_concurrent(g) else ""), "step", arrive, g, r, d)
        elif q.rph == 1:
            yield go(f"r{r} is aborted", "step", abort, g, r)
        if q.pj == 1 and not q.pfl & P_ABORTED:
            yield go(f"P prefills r{r}", "step", p_step, g, r)
        if can_expire_hold(base, g, r):
            yield go(f"P's hold on r{r}'s KV expires", "timeout", expire_hold, r)
        for d in range(nd):
            x = base.res[d][r]
            if x.ph == PH_RESERVED and g.is_push and g.timeout_releases:
                yield go(f"D{d}'s watchdog expires r{r}'s reservation", "timeout", cancel_or_expire, g, d, r)
            if x.ph == PH_ARRIVED or (x.ph == PH_RESERVED and not g.wait_for_arrival):
                yield go(f"D{d} runs r{r}", "step", use, d, r)
            revoke = (REVOKE, r, d, x.pe, base.dinc[d])
            answered = any(m[0] == ACK and m[1:4] == (r, d, base.dinc[d]) for m in base.net)
            if x.ph == PH_REVOKING and g.resend_revoke and revoke not in base.net and not answered:
                yield go(f"D{d} resends Revoke(r{r})", "step", W.send, revoke)
    for m in sorted(set(base.net)):
        yield from deliveries(s, g, m, go, nd, bounds.blocks)
        if m[0] not in DATA and base.lost < bounds.loss:
            yield go(f"lose {describe(m)}", "fault", lose, m)
        if m[0] not in DATA and base.dup < bounds.dup:
            yield go(f"duplicate {describe(m)}", "fault", duplicate, m)
    if g.fence_on_peer_failure and base.fb < base.pe:
        yield go(f"the failure detector fences P#{base.fb}", "step", fence_p, g)
    if base.crashed < bounds.crash:
        yield go("P crashes", "fault", crash_p)
        for d in range(nd):
            yield go(f"D{d} crashes", "fault", crash_d, d)


def deliveries(s: State, g: Design, m: Msg, go: Go, nd: int, blocks: int) -> Iterator[Step]:
    kind, r, d, a, b = m
    take = describe(m)

    def deliver(w: W, fn: Callable[..., object], *args: object) -> None:
        w.net.remove(m)
        fn(w, *args)

    step = go
    if kind in DATA:
        yield step(f"deliver {take}", "step", deliver, land, g, m, True)
        yield step(f"{take} fails", "step", deliver, land, g, m, False)
    elif kind in (RESERVE, DECODE):
        if g.queue_when_full and is_full_for(s, g, d, r, blocks):
            return  # vLLM: the request waits in D's queue until a block is free
        for hit in (0, 1) if kind == RESERVE else (0,):
            label = f"deliver {take}" + (" (D has a prefix hit)" if hit else "")
            yield step(label, "step", deliver, reserve, g, m, hit)
    elif kind in (RFAIL, PREFILLED):
        yield from router_deliveries(s, g, m, step, nd)
    elif kind in TO_P:
        yield step(f"deliver {take}", "step", deliver, on_p_message, g, m)
    else:
        yield step(f"deliver {take}", "step", deliver, on_d_message, g, m)


def is_full_for(s: State, g: Design, d: int, r: int, blocks: int) -> bool:
    """Delivering ``r``'s Reserve or Decode to ``d`` would allocate, and ``d`` has no free block."""
    return is_new_reservation(s[3][d][r], g) and count_held(s[3][d]) >= blocks


def router_deliveries(s: State, g: Design, m: Msg, go: Go, nd: int) -> Iterator[Step]:
    kind, r, d, a, _ = m
    q = s[2][r]
    options = [k for k in range(nd) if not q.tried >> k & 1] if q.rph == 1 else []
    if (kind == RFAIL and q.rd != d) or (kind == PREFILLED and q.tried):
        options = []  # a stale failure, or a duplicate Prefilled of a request already handed off

    def pick(w: W, k: int) -> None:
        w.net.remove(m)
        if k >= 0:
            hand_to(w, g, r, k, a)
        elif kind == RFAIL:
            w.reqs[r] = w.reqs[r]._replace(rd=-1)  # no decode instance has room: D recomputes later

    for k in options:
        yield go(f"deliver {describe(m)}; router picks D{k}", "step", pick, k)
    if not options:
        yield go(f"deliver {describe(m)}", "step", pick, -1)
