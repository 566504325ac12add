"""The discrete-event simulation of a P/D cluster, in plain Python (a heap of timed events).

Plain Python rather than SimPy: the model is a handful of queues and FIFO servers whose every
state change happens at an event, it must be deterministic per seed, and it should run (and be
tested) without a dependency.  Four ways to move a request from P to D:

- ``baseline``: vLLM 0.33 today.  P prefills; P -> router -> D (two hops); D allocates at its next
  step boundary (waiting for blocks if it has none), then pulls the KV.
- ``push``: the proposal.  At arrival the router asks D for a reservation while P queues and
  computes; P pushes into it when both the prefill and the reservation are done.
- ``push-layerwise``: the same, each layer's KV sent as soon as P computed it.
- ``push-jit``: the reservation is asked for only when P *starts* the prefill (P tells the
  router), so D's blocks are not held while the request waits in P's queue.

D acts only at step boundaries: it admits requests whose KV arrived, re-admits preempted ones
(recomputing them locally), allocates for new remote KV in FIFO order while blocks last, gives
each running request its next slot (preempting the last admitted when blocks run out), then runs
one decode step.  Reservations and pulls hold their blocks idle until admission: that idle time,
integrated, is the capacity the figures show as held.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from kvspec.harness.pd.sim import inputs as X

Protocol = Literal["baseline", "push", "push-layerwise", "push-jit"]
PROTOCOLS: tuple[Protocol, ...] = ("baseline", "push", "push-layerwise", "push-jit")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    prompt: tuple[int, int]
    output: tuple[int, int]
    num_prefill: int
    num_decode: int
    d_kv_fraction: float = 1.0  # share of an H200 decode instance's KV memory the cluster gives D
    shape: str = "uniform"  # "uniform" over the ranges, or "lognormal" (medians, clamped to the ranges)
    medians: tuple[float, float] = (0.0, 0.0)  # lognormal: prompt and output medians (tokens)
    sigmas: tuple[float, float] = (1.0, 1.0)  # lognormal: sigma of log(prompt), log(output)
    slo: tuple[float, float] = (1.0, 0.05)  # TTFT and TPOT objectives (seconds) for goodput


@dataclass
class Req:
    rid: int
    arrival: float
    prompt: int
    output: int
    p: int = 0
    d: int = 0
    prefill_start: float = 0.0
    prefill_end: float = 0.0
    reserve_asked: float | None = None
    allocated: float | None = None
    target_known: float | None = None
    arrived: float | None = None
    admitted: float | None = None
    first_token: float | None = None
    done: float | None = None
    generated: int = 0
    pending_chunks: int = 0
    held: int = 0  # D blocks held
    preemptions: int = 0

    @property
    def blocks_remote(self) -> int:
        return X.get_blocks(self.prompt)

    @property
    def blocks_total(self) -> int:
        return X.get_blocks(self.prompt + self.output)


@dataclass
class Decoder:
    free: int
    link_free_at: float = 0.0
    stepping: bool = False
    inbox: list[tuple[str, Req]] = field(default_factory=list)
    pending_alloc: deque[Req] = field(default_factory=deque)
    arrived: deque[Req] = field(default_factory=deque)
    running: list[Req] = field(default_factory=list)
    recompute: deque[Req] = field(default_factory=deque)  # preempted: recomputed on D when blocks allow


class Simulation:
    def __init__(
        self, workload: Workload, protocol: Protocol, rate: float, num_requests: int, seed: int, costs: X.ManagerCosts
    ) -> None:
        self.w, self.protocol, self.costs = workload, protocol, costs
        d_blocks = int(X.D_BLOCKS * workload.d_kv_fraction)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.p_free_at = [0.0] * workload.num_prefill
        self.p_queue: list[deque[Req]] = [deque() for _ in range(workload.num_prefill)]
        self.p_busy = [False] * workload.num_prefill
        self.decoders = [Decoder(d_blocks) for _ in range(workload.num_decode)]
        self.capacity = d_blocks
        self.reqs: list[Req] = []
        self.next_d = 0
        self.seed = seed
        rng = random.Random(seed)
        t = 0.0
        for rid in range(num_requests):
            t += rng.expovariate(rate)
            r = Req(rid, t, *X.sample_lengths(rng, workload))
            self.reqs.append(r)
            self.at(t, "arrive", r)
        self.tokens_out: list[float] = []  # time of every decoded token (for throughput)

    def at(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    def run(self) -> list[Req]:
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"on_{kind.replace('-', '_')}")(t, payload)
        return self.reqs

    # --- router and prefill ----------------------------------------------------------------------

    def on_arrive(self, t: float, r: Req) -> None:
        loads = [
            max(self.p_free_at[p], t) + sum(X.get_prefill_seconds(q.prompt) for q in self.p_queue[p])
            for p in range(self.w.num_prefill)
        ]
        r.p = loads.index(min(loads))
        r.d = self.next_d
        self.next_d = (self.next_d + 1) % self.w.num_decode
        self.at(t + X.ROUTER_HOP_S, "p-enqueue", r)
        if self.protocol in ("push", "push-layerwise"):
            r.reserve_asked = t
            self.at(t + X.ROUTER_HOP_S, "d-inbox", ("reserve", r))

    def on_p_enqueue(self, t: float, r: Req) -> None:
        self.p_queue[r.p].append(r)
        if not self.p_busy[r.p]:
            self.start_prefill(t, r.p)

    def start_prefill(self, t: float, p: int) -> None:
        r = self.p_queue[p].popleft()
        self.p_busy[p] = True
        r.prefill_start = t
        r.prefill_end = t + X.get_prefill_seconds(r.prompt)
        self.p_free_at[p] = r.prefill_end
        self.at(r.prefill_end, "prefill-done", r)
        if self.protocol == "push-jit":  # P tells the router, which asks D
            r.reserve_asked = t
            self.at(t + 2 * X.ROUTER_HOP_S, "d-inbox", ("reserve", r))
        if self.protocol == "push-layerwise":
            self.release_chunks(t, r)

    def on_prefill_done(self, t: float, r: Req) -> None:
        self.p_busy[r.p] = False
        if self.p_queue[r.p]:
            self.start_prefill(t, r.p)
        if self.protocol == "baseline":  # P -> router -> D
            self.at(t + 2 * X.ROUTER_HOP_S, "d-inbox", ("load", r))
        elif self.protocol in ("push", "push-jit"):
            self.release_chunks(t, r)

    # --- the KV transfer -------------------------------------------------------------------------

    def release_chunks(self, t: float, r: Req) -> None:
        """Push: a chunk leaves once its KV exists and P knows where to write it."""
        if r.target_known is None or r.pending_chunks or r.prefill_end == 0.0:
            return
        if self.protocol == "push-layerwise":
            n = X.N_LAYERS
            ready = [r.prefill_start + (k + 1) * (r.prefill_end - r.prefill_start) / n for k in range(n)]
        elif t < r.prefill_end:
            return
        else:
            n, ready = 1, [r.prefill_end]
        r.pending_chunks = n
        for when in ready:
            self.at(max(when, r.target_known), "chunk", (r, n))

    def on_chunk(self, t: float, payload: tuple[Req, int]) -> None:
        r, n = payload
        self.transfer(t, r, r.prompt / n)

    def transfer(self, t: float, r: Req, tokens: float) -> None:
        """D's inbound link serves transfers first come, first served."""
        d = self.decoders[r.d]
        start = max(t + X.TRANSFER_LATENCY_S, d.link_free_at)
        d.link_free_at = start + X.get_transfer_seconds(int(tokens))
        self.at(d.link_free_at, "chunk-landed", r)

    def on_chunk_landed(self, t: float, r: Req) -> None:
        if self.protocol != "baseline":
            r.pending_chunks -= 1
            if r.pending_chunks:
                return
        self.on_d_inbox(t, ("arrived", r))

    def on_target(self, t: float, r: Req) -> None:
        r.target_known = t
        self.release_chunks(t, r)

    # --- the decode instance ---------------------------------------------------------------------

    def on_d_inbox(self, t: float, item: tuple[str, Req]) -> None:
        d = self.decoders[item[1].d]
        d.inbox.append(item)
        if not d.stepping:
            self.begin_step(t, item[1].d)

    def begin_step(self, t: float, i: int) -> None:
        """One engine step of D: inputs, admissions, allocations, growth, then the forward pass."""
        d = self.decoders[i]
        cpu = 0.0
        for kind, r in d.inbox:
            if kind == "arrived":
                r.arrived = t
                cpu += self.costs.get("cache_blocks", r.blocks_remote)
                d.arrived.append(r)
            else:
                d.pending_alloc.append(r)
        d.inbox.clear()
        while d.arrived:  # arrived KV is admitted first (vLLM's kv_holding queue)
            r = d.arrived.popleft()
            r.admitted = t
            d.running.append(r)
        while d.recompute and d.free >= X.get_blocks(d.recompute[0].prompt + d.recompute[0].generated + 1):
            r = d.recompute.popleft()
            r.held = X.get_blocks(r.prompt + r.generated + 1)
            d.free -= r.held
            cpu += X.get_prefill_seconds(r.prompt + r.generated)  # a local prefill on D
            d.running.append(r)
        while d.pending_alloc and d.free >= d.pending_alloc[0].blocks_remote:
            r = d.pending_alloc.popleft()
            d.free -= r.blocks_remote
            r.held = r.blocks_remote
            r.allocated = t
            cpu += self.costs.admission(r.blocks_remote)
            if self.protocol == "baseline":
                self.transfer(t, r, r.prompt)
            else:  # D -> router -> P
                self.at(t + cpu + 2 * X.ROUTER_HOP_S, "target", r)
        self.grow(d)
        if not d.running:
            d.stepping = False
            return
        d.stepping = True
        context = sum(r.prompt + r.generated for r in d.running)
        self.at(t + cpu + X.get_decode_step_seconds(len(d.running), context), "step-end", i)

    def grow(self, d: Decoder) -> None:
        """Every running request needs a slot for this step's token; when blocks run out, the last
        admitted request is preempted (vLLM 0.33, docs/semantics.md §8) and recomputed later."""
        k = 0
        while k < len(d.running):
            r = d.running[k]
            need = X.get_blocks(r.prompt + r.generated + 1) - r.held
            if need <= d.free:
                d.free -= need
                r.held += need
                k += 1
                continue
            victim = d.running.pop()
            d.free += victim.held
            victim.held = 0
            victim.preemptions += 1
            d.recompute.appendleft(victim)

    def on_step_end(self, t: float, i: int) -> None:
        d = self.decoders[i]
        still = []
        for r in d.running:
            r.generated += 1
            self.tokens_out.append(t)
            if r.first_token is None:
                r.first_token = t
            if r.generated >= r.output:
                r.done = t
                d.free += r.held
                r.held = 0
            else:
                still.append(r)
        d.running = still
        self.begin_step(t, i)
