"""The discrete-event simulation of a P/D cluster, in plain Python (a heap of timed events).

Plain Python rather than SimPy: the model is a handful of queues and FIFO servers whose every
state change happens at an event, it must be deterministic per seed, and it should run (and be
tested) without a dependency.  Five ways to move a request from P to D:

- ``pull``: vLLM's NIXL pull.  P prefills; P -> router -> D (two hops); D allocates at its next
  step boundary (waiting for blocks if it has none), then reads the KV; P frees on D's
  ``ReadDone`` (one more hop).
- ``push-seq``: vLLM's push with sequential dispatch.  The router sends to D only after P
  finished (two hops, as for the pull); D allocates at its next step boundary and registers its
  blocks with P (one hop, D -> P); P writes and frees when its writes complete.  No early
  reservation.
- ``push-concurrent``: the proposal.  At arrival the router asks D for a reservation while P
  queues and computes; D answers through the router (two hops); P writes when both the prefill
  and the reservation are done.
- ``push-concurrent-layerwise``: the same, each layer's KV sent as soon as P computed it.
- ``push-concurrent-jit``: the reservation is asked for only when P *starts* the prefill (P tells
  the router, which asks D), so D's blocks are not held while the request waits in P's queue.

P holds a request's KV from the start of its prefill until the transfer is over (push: its writes
completed; pull: D's ``ReadDone`` arrived); when P's KV memory cannot hold the next prompt, P
stalls until a transfer frees enough.  D acts only at step boundaries: it admits requests whose
KV arrived, re-admits preempted ones (recomputing them locally), allocates for new remote KV in
FIFO order while blocks last, gives each running request its next slot (preempting the last
admitted when blocks run out), then runs one decode step.  Reservations and loads hold their
blocks idle until admission: that idle time, integrated, is the capacity reported as held.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from kvspec.harness.pd.sim import inputs as X

Protocol = Literal["pull", "push-seq", "push-concurrent", "push-concurrent-layerwise", "push-concurrent-jit"]
PROTOCOLS: tuple[Protocol, ...] = (
    "pull",
    "push-seq",
    "push-concurrent",
    "push-concurrent-layerwise",
    "push-concurrent-jit",
)
# the comparison that isolates each design's effect: (design, its baseline)
BASELINE_OF: dict[str, str] = {
    "push-seq": "pull",  # the transfer direction
    "push-concurrent": "push-seq",  # early dispatch
    "push-concurrent-layerwise": "push-seq",  # early dispatch + layer-wise streaming
    "push-concurrent-jit": "push-seq",  # dispatch when the prefill starts
}
RESERVE_AT_ARRIVAL = ("push-concurrent", "push-concurrent-layerwise")


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
    p_kv_fraction: float | None = 1.0  # share of an H200's KV memory each P has; None: unbounded


@dataclass
class Req:
    rid: int
    arrival: float
    prompt: int
    output: int
    p: int = 0
    d: int = 0
    p_enqueued: float = 0.0
    prefill_start: float = 0.0
    prefill_end: float = 0.0
    reserve_asked: float | None = None
    allocated: float | None = None
    target_known: float | None = None
    arrived: float | None = None
    admitted: float | None = None
    first_token: float | None = None
    done: float | None = None
    p_freed: float | None = None
    generated: int = 0
    pending_chunks: int = 0
    held: int = 0  # D blocks held
    p_held: int = 0  # P blocks held
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


@dataclass
class Prefiller:
    free: float  # KV blocks (inf when unbounded)
    free_at: float = 0.0
    busy: bool = False
    queue: deque[Req] = field(default_factory=deque)
    queued_s: float = 0.0  # prefill seconds waiting in the queue (the router's load estimate)
    stalled_since: float | None = None  # P idle with work queued, for want of KV memory
    stalled_s: float = 0.0


class Simulation:
    def __init__(
        self, workload: Workload, protocol: Protocol, rate: float, num_requests: int, seed: int, costs: X.ManagerCosts
    ) -> None:
        assert protocol in PROTOCOLS, f"unknown protocol {protocol!r}"
        self.w, self.protocol, self.costs = workload, protocol, costs
        d_blocks = int(X.D_BLOCKS * workload.d_kv_fraction)
        self.p_capacity = float("inf") if workload.p_kv_fraction is None else int(X.D_BLOCKS * workload.p_kv_fraction)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.prefillers = [Prefiller(self.p_capacity) for _ in range(workload.num_prefill)]
        self.decoders = [Decoder(d_blocks) for _ in range(workload.num_decode)]
        self.capacity = d_blocks
        self.reqs: list[Req] = []
        self.next_d = 0
        self.seed = seed
        self.now = 0.0
        rng = random.Random(seed)
        t = 0.0
        for rid in range(num_requests):
            t += rng.expovariate(rate)
            r = Req(rid, t, *X.sample_lengths(rng, workload))
            self.reqs.append(r)
            self.at(t, "arrive", r)
        self.span = t  # the last arrival
        self.tokens_in_span = 0  # tokens decoded before the last arrival (for throughput)

    def at(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    def run(self) -> list[Req]:
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            getattr(self, f"on_{kind.replace('-', '_')}")(t, payload)
        for p in self.prefillers:
            assert p.stalled_since is None and not p.queue, "a prefill instance ended with work it never started"
        return self.reqs

    # --- router and prefill ----------------------------------------------------------------------

    def on_arrive(self, t: float, r: Req) -> None:
        loads = [max(p.free_at, t) + p.queued_s for p in self.prefillers]
        r.p = loads.index(min(loads))
        r.d = self.next_d
        self.next_d = (self.next_d + 1) % self.w.num_decode
        self.at(t + X.ROUTER_HOP_S, "p-enqueue", r)
        if self.protocol in RESERVE_AT_ARRIVAL:
            r.reserve_asked = t
            self.at(t + X.ROUTER_HOP_S, "d-inbox", ("reserve", r))

    def on_p_enqueue(self, t: float, r: Req) -> None:
        p = self.prefillers[r.p]
        r.p_enqueued = t
        p.queue.append(r)
        p.queued_s += X.get_prefill_seconds(r.prompt)
        self.start_prefill(t, r.p)

    def start_prefill(self, t: float, i: int) -> None:
        """P starts its next prefill if it is idle, has one queued and has KV memory for it."""
        p = self.prefillers[i]
        if p.busy or not p.queue:
            return
        r = p.queue[0]
        if p.free < r.blocks_remote:
            if p.stalled_since is None:
                p.stalled_since = t
            return
        if p.stalled_since is not None:
            p.stalled_s += t - p.stalled_since
            p.stalled_since = None
        p.queue.popleft()
        p.queued_s -= X.get_prefill_seconds(r.prompt)
        p.free -= r.blocks_remote
        r.p_held = r.blocks_remote
        p.busy = True
        r.prefill_start = t
        r.prefill_end = t + X.get_prefill_seconds(r.prompt)
        p.free_at = r.prefill_end
        self.at(r.prefill_end, "prefill-done", r)
        if self.protocol == "push-concurrent-jit":  # P tells the router, which asks D
            r.reserve_asked = t
            self.at(t + 2 * X.ROUTER_HOP_S, "d-inbox", ("reserve", r))
        if self.protocol == "push-concurrent-layerwise":
            self.release_chunks(t, r)

    def on_prefill_done(self, t: float, r: Req) -> None:
        self.prefillers[r.p].busy = False
        self.start_prefill(t, r.p)
        if self.protocol in ("pull", "push-seq"):  # P -> router -> D, only now
            r.reserve_asked = t
            self.at(t + 2 * X.ROUTER_HOP_S, "d-inbox", ("load", r))
        else:
            self.release_chunks(t, r)

    def on_p_free(self, t: float, r: Req) -> None:
        """The transfer is over for P: it frees the request's KV and may start a stalled prefill."""
        p = self.prefillers[r.p]
        p.free += r.p_held
        r.p_held = 0
        r.p_freed = t
        self.start_prefill(t, r.p)

    # --- the KV transfer -------------------------------------------------------------------------

    def release_chunks(self, t: float, r: Req) -> None:
        """Push: a chunk leaves once its KV exists and P knows where to write it."""
        if r.target_known is None or r.pending_chunks or r.prefill_end == 0.0:
            return
        if self.protocol == "push-concurrent-layerwise":
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
        if self.protocol == "pull":  # D's read completed; its ReadDone reaches P one hop later
            self.at(t + X.PEER_HOP_S, "p-free", r)
        else:
            r.pending_chunks -= 1
            if r.pending_chunks:
                return
            self.on_p_free(t, r)  # P's last write completed
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
            self.answer_allocation(t + cpu, r)
        self.grow(d)
        if not d.running:
            d.stepping = False
            return
        d.stepping = True
        context = sum(r.prompt + r.generated for r in d.running)
        self.at(t + cpu + X.get_decode_step_seconds(len(d.running), context), "step-end", i)

    def answer_allocation(self, t: float, r: Req) -> None:
        """D allocated at ``t``: pull reads now; push-seq registers with P (one hop); the concurrent
        designs answer through the router, which relays to P (two hops)."""
        if self.protocol == "pull":
            self.transfer(t, r, r.prompt)
        elif self.protocol == "push-seq":
            self.at(t + X.PEER_HOP_S, "target", r)
        else:
            self.at(t + 2 * X.ROUTER_HOP_S, "target", r)

    def grow(self, d: Decoder) -> None:
        """Every running request needs a slot for this step's token; when blocks run out, the last
        admitted request is preempted (vLLM 0.33, docs/semantics.md §8) and recomputed later.
        Blocks allocated for remote KV not yet admitted are never preempted."""
        k = 0
        while k < len(d.running):
            r = d.running[k]
            if r.prompt + r.generated < r.held * X.BLOCK_SIZE:  # this step's slot is in a held block
                k += 1
                continue
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
        if t <= self.span:
            self.tokens_in_span += len(d.running)
        still = []
        for r in d.running:
            r.generated += 1
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
