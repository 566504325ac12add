"""Every input of the simulation: measured where this machine can measure it, otherwise an
assumption with its source.  docs/pd-preallocation.md prints ``ASSUMPTIONS`` as a table.

Measured: the decode instance's manager calls on real vLLM 0.33 (``measure``; stored in
docs/figures/pd-manager-costs.json).  Assumed: everything about the GPU, the model, the network and
the traffic (this machine has no GPU, and no model weights or traces can be fetched).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GB = 1e9


@dataclass(frozen=True, slots=True)
class Assumption:
    name: str
    value: str
    source: str


# --- model and GPU --------------------------------------------------------------------------------

N_PARAMS = 8.03e9  # Llama-3.1-8B
N_LAYERS = 32
KV_BYTES_PER_TOKEN = 2 * N_LAYERS * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16: 128 KiB
WEIGHT_BYTES = 2 * N_PARAMS
PEAK_FLOPS = 989e12  # H200 SXM dense BF16
MFU_PREFILL = 0.5
HBM_BYTES_PER_S = 4.8e12
HBM_EFFICIENCY = 0.8
GPU_MEMORY = 141 * GB
GPU_MEMORY_UTILIZATION = 0.9
ACTIVATION_RESERVE = 4 * GB
STEP_OVERHEAD_S = 3e-3  # scheduler, sampling, launch: per engine step
PREFILL_OVERHEAD_S = 2e-3
BLOCK_SIZE = 16

D_KV_BYTES = GPU_MEMORY * GPU_MEMORY_UTILIZATION - WEIGHT_BYTES - ACTIVATION_RESERVE
D_BLOCKS = int(D_KV_BYTES // (BLOCK_SIZE * KV_BYTES_PER_TOKEN))

# --- network and control plane --------------------------------------------------------------------

LINK_BYTES_PER_S = 400e9 / 8 * 0.8  # ConnectX-7 NDR 400 Gb/s per GPU, 80% achieved
TRANSFER_LATENCY_S = 50e-6
ROUTER_HOP_S = 0.5e-3
PEER_HOP_S = ROUTER_HOP_S  # a direct P <-> D control message (push registration, pull's ReadDone)

ASSUMPTIONS = (
    Assumption(
        "model",
        "Llama-3.1-8B, bf16: 8.03e9 parameters, 32 layers, 8 KV heads x 128",
        "meta-llama/Llama-3.1-8B config.json and model card",
    ),
    Assumption(
        "KV per token",
        f"{KV_BYTES_PER_TOKEN // 1024} KiB (2 x 32 x 8 x 128 x 2 bytes)",
        "derived from the model config",
    ),
    Assumption(
        "GPU",
        "one NVIDIA H200 SXM per instance: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e, 141 GB",
        "NVIDIA H200 Tensor Core GPU datasheet",
    ),
    Assumption(
        "prefill time",
        f"{PREFILL_OVERHEAD_S * 1e3:.0f} ms + (2 N L + 2 x 32 x 4096 L^2) FLOPs at {MFU_PREFILL:.0%} of peak",
        "FLOP count of a dense decoder (Kaplan et al. 2020, 2N per token, plus "
        "causal attention); 50% MFU is our assumption for prefill of this size",
    ),
    Assumption(
        "decode step",
        f"{STEP_OVERHEAD_S * 1e3:.0f} ms + (weights + KV of the batch) / ({HBM_EFFICIENCY:.0%} of 4.8 TB/s)",
        "decode is memory bound (roofline); overhead and efficiency are our assumptions",
    ),
    Assumption(
        "decode KV capacity",
        f"{D_BLOCKS} blocks of {BLOCK_SIZE} tokens: 0.9 x 141 GB - 16.1 GB weights - 4 GB activations",
        "vLLM's default gpu_memory_utilization 0.9 and block size 16; the activation reserve is our assumption",
    ),
    Assumption(
        "decode admission and preemption",
        "blocks for the prompt are allocated when the remote KV is admitted for loading (FIFO, head of line "
        "waits for blocks); a running request grows one slot per step; when D runs out, the last admitted "
        "running request is preempted (all its blocks freed) and recomputed on D later (a local prefill "
        "charged to that step), before any new allocation; blocks allocated for KV not yet arrived are "
        "never preempted",
        "vLLM 0.33 scheduler: recompute preemption of the running queue's tail (docs/semantics.md §8); "
        "WAITING_FOR_REMOTE_KVS requests are not running, so not preempted",
    ),
    Assumption(
        "prefill KV capacity",
        "each P gets the same KV budget as a decode instance (the whole H200 budget, or 40% on long-tight "
        "and 16% on conv-decode-bound); P allocates the prompt when the "
        "prefill starts and holds it until the transfer ends (push: its writes completed; pull: D's ReadDone "
        "arrived); a P whose free blocks cannot hold its next prompt stalls (FCFS, no skipping)",
        "same GPU, model and gpu_memory_utilization as D; vLLM's P keeps finished KV for the transfer "
        "(its kv_lease_duration, 30 s, is not modelled)",
    ),
    Assumption(
        "KV transfer",
        f"{LINK_BYTES_PER_S / GB:.0f} GB/s into each decode GPU (FIFO), {TRANSFER_LATENCY_S * 1e6:.0f} us per transfer",
        "NVIDIA ConnectX-7 datasheet (400 Gb/s NDR per GPU); 80% achieved is our assumption",
    ),
    Assumption(
        "control messages",
        f"{ROUTER_HOP_S * 1e3:.1f} ms per hop, router or direct P <-> D (pull: P -> router -> D, then D reads; "
        "push-seq: P -> router -> D, D -> P registration; push-concurrent: router -> D reserve, "
        "D -> router -> P target; jit: P -> router -> D at prefill start; pull's ReadDone D -> P)",
        "our assumption for an in-datacenter RPC (vLLM's disaggregated proxy is HTTP)",
    ),
    Assumption(
        "engine steps",
        "a decode instance acts on new requests, arrivals and reservations only at step boundaries",
        "vLLM v1 EngineCore busy loop: inputs are drained between steps, then schedule()",
    ),
    Assumption("arrivals", "Poisson", "vllm bench serve --request-rate with the default burstiness 1.0"),
    Assumption(
        "lengths (synthetic)",
        "chat: prompt U[512, 2048], output U[128, 384], 1 P : 1 D; "
        "long: prompt U[4096, 12288], output U[128, 384], 2 P : 1 D",
        "our choice, shaped like vllm bench serve's random dataset with a range ratio",
    ),
    Assumption(
        "lengths (published shapes)",
        "lognormal, clamped: splitwise-conv prompt median 1020, output median 129; splitwise-code prompt "
        "median 1500, output median 13; mooncake prompt mean 7590, output mean 182 (sigma 1.0 prompt, "
        "0.8 output: medians mean/exp(sigma^2/2))",
        "medians/means as published for the Azure LLM inference traces (Splitwise, ISCA'24) and Kimi's "
        "trace (Mooncake, FAST'25); the lognormal form and the sigmas are assumptions, not fitted "
        "(checked against two public traces in docs/pd-simulation.md); `--workloads NAME@sigma=S` sweeps them",
    ),
    Assumption(
        "SLOs (goodput)",
        "TTFT <= 1 s and TPOT <= 50 ms (chat, splitwise-*); TTFT <= 5 s and TPOT <= 100 ms (long, mooncake)",
        "our choice; goodput as in DistServe (OSDI'24): requests per second that meet both objectives",
    ),
    Assumption(
        "prefill instances",
        "FCFS, one prefill at a time (no batching, no chunking); the router sends each request to the P "
        "with the least queued prefill work",
        "simplification",
    ),
)


def sample_lengths(rng: Any, w: Any) -> tuple[int, int]:
    """One request's prompt and output lengths for workload ``w`` (``sim.model.Workload``)."""
    if w.shape == "uniform":
        return rng.randint(*w.prompt), rng.randint(*w.output)
    assert w.shape == "lognormal", f"unknown length shape {w.shape!r}"
    out = []
    for median, sigma, (lo, hi) in zip(w.medians, w.sigmas, (w.prompt, w.output)):
        out.append(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))
    return out[0], out[1]


def get_prefill_seconds(prompt: int) -> float:
    flops = 2 * N_PARAMS * prompt + 2 * N_LAYERS * 4096 * prompt * prompt
    return PREFILL_OVERHEAD_S + flops / (PEAK_FLOPS * MFU_PREFILL)


def get_decode_step_seconds(batch: int, context_tokens: int) -> float:
    if batch == 0:
        return 0.0
    return STEP_OVERHEAD_S + (WEIGHT_BYTES + context_tokens * KV_BYTES_PER_TOKEN) / (HBM_BYTES_PER_S * HBM_EFFICIENCY)


def get_transfer_seconds(tokens: int) -> float:
    return tokens * KV_BYTES_PER_TOKEN / LINK_BYTES_PER_S


def get_blocks(tokens: int) -> int:
    return math.ceil(tokens / BLOCK_SIZE)


class ManagerCosts:
    """Measured seconds per manager call, interpolated in the prompt's block count."""

    def __init__(self, measured: dict[str, Any] | None) -> None:
        self.table = {} if measured is None else {int(k): v for k, v in measured["median_s"].items()}

    def get(self, call: str, blocks: int) -> float:
        if not self.table:
            return 0.0
        keys = sorted(self.table)
        lo = max([k for k in keys if k <= blocks], default=keys[0])
        hi = min([k for k in keys if k >= blocks], default=keys[-1])
        if hi == lo:
            return float(self.table[lo][call])
        w = (blocks - lo) / (hi - lo)
        return float(self.table[lo][call] * (1 - w) + self.table[hi][call] * w)

    def admission(self, blocks: int) -> float:
        """A remote-KV admission on D: lookup plus allocation."""
        return self.get("get_computed_blocks", blocks) + self.get("allocate_slots", blocks)
