"""The abstract cluster the search explores, as plain tuples (hashable, cheap to compare).

A state is ``(pe, dinc, reqs, res, net, lost, dup, crashed, fb)``:

- ``pe``: the prefill instance's incarnation; ``dinc[d]``: decode instance ``d``'s;
- ``reqs[r]``: the router's record and P's job of request ``r`` (``Req``);
- ``res[d][r]``: ``r``'s reservation (or pull handoff) on ``d`` (``Res``);
- ``net``: the messages in flight, a sorted multiset (the network may deliver any, in any order);
- the fault budgets used so far: messages lost, duplicated, instances crashed;
- ``fb``: the decode instances have fenced every P incarnation below ``fb`` (the failure detector
  fences a crashed P in a move of its own, some time after the crash).

Blocks are not named: a reservation owns one block for its transfer, and the rules ask only
whether the block a transfer lands in is held *for that transfer*, so block ids are
interchangeable and the model is already the quotient under renaming them.  Requests are
interchangeable too (same prompt, same choices), and so are the decode instances (same
capacity): ``canonical`` picks the least of a state's renamings, which is sound because every
transition and every rule treats ids only by equality (docs/pd-preallocation.md §Model check).
"""

from __future__ import annotations

from itertools import permutations
from typing import NamedTuple


class Req(NamedTuple):
    rph: int  # router: 0 not arrived, 1 active, 2 aborted
    rd: int  # router: the decode instance it reserved on / handed off to, or -1
    tried: int  # router: bitmask of decode instances tried
    pj: int  # P: 0 no job, 1 queued, 2 holding its KV, 3 KV freed
    ptgt: tuple[int, ...]  # P: () or (d, dinc, hit): where to write (push)
    pout: int  # P: transfers issued whose completion P has not seen
    pfl: int  # P: flag bits (P_*)
    ptomb: int  # P: bitmask of decode instances whose lease P tombstoned (revoked)
    pack: tuple[tuple[int, int], ...]  # P: (d, dinc) revokes to acknowledge once drained


class Res(NamedTuple):
    ph: int  # PH_*
    hit: int  # D had a prefix hit (a shared, published block P must not write)
    landed: int  # the transfer's data landed
    told: int  # D was told a transfer failed (it recomputes)
    tomb: int  # a Cancel arrived before the Reserve
    pe: int  # the P incarnation the reservation waits for


P_ABORTED, P_ISSUED, P_DONE_SENT, P_FAILED = 1, 2, 4, 8

PH_NONE, PH_RESERVED, PH_REVOKING, PH_ARRIVED, PH_USED, PH_RELEASED, PH_ABORT_WAIT, PH_ORPHAN, PH_CRASHED = range(9)
HELD = frozenset({PH_RESERVED, PH_REVOKING, PH_ARRIVED, PH_ABORT_WAIT, PH_ORPHAN})
PH_NAMES = ("none", "reserved", "revoking", "arrived", "used", "released", "abort-wait", "orphan", "crashed")

# message kinds: (kind, r, d, a, b)
PREFILL, RESERVE, REG, WRITE, DONE, CANCEL, REVOKE, ACK, ABORT, RFAIL, PREFILLED, DECODE, READ, READDONE = range(14)
KIND_NAMES = (
    "Prefill",
    "Reserve",
    "Register",
    "Write",
    "Done",
    "Cancel",
    "Revoke",
    "RevokeAck",
    "Abort",
    "ReserveFailed",
    "Prefilled",
    "Decode",
    "Read",
    "ReadDone",
)
DATA = frozenset({WRITE, READ})  # one-sided RDMA: never lost or duplicated, may fail (error completion)
TO_P = frozenset({PREFILL, REG, REVOKE, ABORT, READDONE})
TO_ROUTER = frozenset({RFAIL, PREFILLED})
NO_D = frozenset({PREFILL, ABORT, PREFILLED, READDONE})  # their ``d`` field is unused (always 0)

Msg = tuple[int, int, int, int, int]
State = tuple[int, tuple[int, ...], tuple[Req, ...], tuple[tuple[Res, ...], ...], tuple[Msg, ...], int, int, int, int]

NO_REQ = Req(0, -1, 0, 0, (), 0, 0, 0, ())
NO_RES = Res(PH_NONE, 0, 0, 0, 0, 0)


def init_state(num_requests: int, num_decoders: int) -> State:
    res = tuple(tuple(NO_RES for _ in range(num_requests)) for _ in range(num_decoders))
    return (0, (0,) * num_decoders, (NO_REQ,) * num_requests, res, (), 0, 0, 0, 0)


def describe(m: Msg) -> str:
    kind, r, d, a, b = m
    dst = "P" if kind in TO_P else "router" if kind in TO_ROUTER else f"D{d}"
    who = f"r{r}" if kind in (PREFILL, ABORT, PREFILLED, READDONE) else f"r{r}@D{d}"
    extra = {
        WRITE: f", {'hit block, ' if b & 1 else ''}from P#{b >> 1}",
        DONE: ", failed" if b else "",
        ACK: f", from P#{b}",
    }.get(kind, "")
    return f"{KIND_NAMES[kind]}({who}{extra}) to {dst}"


def _remap_mask(mask: int, dmap: tuple[int, ...]) -> int:
    out = 0
    for d, nd in enumerate(dmap):
        if mask >> d & 1:
            out |= 1 << nd
    return out


def _remap_req(q: Req, dmap: tuple[int, ...]) -> Req:
    if q == NO_REQ:
        return q
    tgt = (dmap[q.ptgt[0]],) + q.ptgt[1:] if q.ptgt else ()
    pack = tuple(sorted((dmap[d], i) for d, i in q.pack))
    rd = dmap[q.rd] if q.rd >= 0 else -1
    return q._replace(rd=rd, tried=_remap_mask(q.tried, dmap), ptgt=tgt, ptomb=_remap_mask(q.ptomb, dmap), pack=pack)


def rename(s: State, rmap: tuple[int, ...], dmap: tuple[int, ...]) -> State:
    """``s`` with request ``r`` called ``rmap[r]`` and decode instance ``d`` called ``dmap[d]``."""
    pe, dinc, reqs, res, net, lost, dup, crashed, fb = s
    nreqs: list[Req] = [NO_REQ] * len(reqs)
    for r, q in enumerate(reqs):
        nreqs[rmap[r]] = _remap_req(q, dmap)
    ndinc = [0] * len(dinc)
    nres: list[tuple[Res, ...]] = [()] * len(res)
    for d, row in enumerate(res):
        ndinc[dmap[d]] = dinc[d]
        nrow: list[Res] = [NO_RES] * len(row)
        for r, x in enumerate(row):
            nrow[rmap[r]] = x
        nres[dmap[d]] = tuple(nrow)
    nnet = tuple(sorted((k, rmap[r], d if k in NO_D else dmap[d], a, b) for k, r, d, a, b in net))
    return (pe, tuple(ndinc), tuple(nreqs), tuple(nres), nnet, lost, dup, crashed, fb)


class Symmetry:
    """The renamings of requests and decode instances; ``canonical`` is the least renaming."""

    def __init__(self, num_requests: int, num_decoders: int, enabled: bool = True) -> None:
        rps = list(permutations(range(num_requests))) if enabled else [tuple(range(num_requests))]
        dps = list(permutations(range(num_decoders))) if enabled else [tuple(range(num_decoders))]
        self.maps = [(rp, dp) for rp in rps for dp in dps]

    def canonical(self, s: State) -> State:
        if len(self.maps) == 1:
            return s
        return min(rename(s, rp, dp) for rp, dp in self.maps)
