"""A closed-form estimate of what early dispatch buys and what it holds, to check the simulation.

Relative to sequential push (D hears of the request only when P finished), concurrent push moves
three control hops (P -> router -> D, D -> P), D's wait for its next step boundary and D's
allocation off the critical path, as far as they fit before the prefill ends:

    saved = 3 hop + wait + alloc - max(0, wait + alloc + 2 hop - (Wq + S))

and it holds D's blocks from the reservation until admission, through P's queue and prefill:

    held = lambda_D x E[blocks x (max(Wq + S, wait + alloc + 2 hop) + transfer)] / D's blocks

(Little's law).  ``Wq`` is P's queueing delay: Pollaczek-Khinchine for one P, the Erlang-C delay
scaled by (1 + C_s^2) / 2 for several (the Lee-Longton approximation).  ``wait`` is D's mean
residual step: busy x T / 2 with T the decode step at the load's mean batch (T = a + b x context,
the context from Little's law on decoding requests) and busy = 1 - exp(-mean batch) (M/G/inf).
``alloc`` is the measured ``get_computed_blocks`` + ``allocate_slots``.  Everything else
(D's link contention, preemption, P's memory) is left out, which is what the check measures.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from kvspec.harness.pd.sim import inputs as X
from kvspec.harness.pd.sim.experiment import get_prefill_capacity
from kvspec.harness.pd.sim.model import Workload

SAMPLES = 20_000


@dataclass(frozen=True)
class Estimate:
    workload: str
    load: float
    p_wait_ms: float  # P's mean queueing delay
    step_ms: float  # D's decode step
    step_wait_ms: float  # D's mean wait for its next step boundary
    alloc_ms: float  # D's measured allocation
    saved_ms: float  # concurrent push over sequential push: mean TTFT
    saved_jit_ms: float  # jit (reserve at prefill start) over sequential push
    saved_layerwise_ms: float  # concurrent + layer-wise over sequential push
    held_concurrent: float  # share of D's blocks held idle
    held_jit: float
    held_seq: float


def get_erlang_c_wait(servers: int, rate: float, mean_s: float) -> float:
    """Mean queueing delay of M/M/c (Erlang C)."""
    a = rate * mean_s
    rho = a / servers
    if rho >= 1:
        return float("inf")
    tail = a**servers / math.factorial(servers) / (1 - rho)
    p_wait = tail / (sum(a**k / math.factorial(k) for k in range(servers)) + tail)
    return p_wait * mean_s / (servers - a)


def get_queue_wait(servers: int, rate: float, service: list[float]) -> float:
    """P's mean queueing delay: exact M/G/1 (Pollaczek-Khinchine), approximate M/G/c."""
    mean = statistics.fmean(service)
    second = statistics.fmean(s * s for s in service)
    if servers == 1:
        rho = rate * mean
        return float("inf") if rho >= 1 else rate * second / (2 * (1 - rho))
    cs2 = second / (mean * mean) - 1
    return get_erlang_c_wait(servers, rate, mean) * (1 + cs2) / 2


def estimate(w: Workload, load: float, costs: X.ManagerCosts) -> Estimate:
    rng = random.Random(0)
    lengths = [X.sample_lengths(rng, w) for _ in range(SAMPLES)]
    rate = load * get_prefill_capacity(w)
    service = [X.get_prefill_seconds(p) for p, _ in lengths]
    wq = get_queue_wait(w.num_prefill, rate, service)
    rate_d = rate / w.num_decode
    bw = X.HBM_BYTES_PER_S * X.HBM_EFFICIENCY
    a, b = X.STEP_OVERHEAD_S + X.WEIGHT_BYTES / bw, X.KV_BYTES_PER_TOKEN / bw
    context_per_t = rate_d * statistics.fmean(o * (p + o / 2) for p, o in lengths)  # context = this x T
    step = a / (1 - b * context_per_t) if b * context_per_t < 1 else float("inf")
    batch = rate_d * statistics.fmean(o for _, o in lengths) * step
    wait = (1 - math.exp(-batch)) * step / 2
    hop = X.ROUTER_HOP_S
    saved, saved_jit, saved_lw, held_c, held_j, held_s = [], [], [], [], [], []
    for (prompt, _), s in zip(lengths, service):
        blocks = X.get_blocks(prompt)
        alloc = costs.admission(blocks)
        xfer = X.TRANSFER_LATENCY_S + X.get_transfer_seconds(prompt)
        ready = wait + alloc + 2 * hop  # the reservation's answer reaches P, counted from D's inbox
        cut = 3 * hop + wait + alloc
        saved.append(cut - max(0.0, ready - (wq + s)))
        saved_jit.append(cut - max(0.0, ready + 2 * hop - s))
        saved_lw.append(saved[-1] + xfer * (1 - 1 / X.N_LAYERS))
        held_c.append(blocks * (max(wq + s, ready) + xfer))
        held_j.append(blocks * (max(s, ready + 2 * hop) - 2 * hop + xfer))
        held_s.append(blocks * (alloc + hop + xfer + wait))
    cap = int(X.D_BLOCKS * w.d_kv_fraction)
    return Estimate(
        w.name,
        load,
        wq * 1e3,
        step * 1e3,
        wait * 1e3,
        statistics.fmean(costs.admission(X.get_blocks(p)) for p, _ in lengths) * 1e3,
        statistics.fmean(saved) * 1e3,
        statistics.fmean(saved_jit) * 1e3,
        statistics.fmean(saved_lw) * 1e3,
        rate_d * statistics.fmean(held_c) / cap,
        rate_d * statistics.fmean(held_j) / cap,
        rate_d * statistics.fmean(held_s) / cap,
    )
