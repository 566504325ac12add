"""A decode instance's engine step: what vLLM 0.33's scheduler does with the requests D holds.

In one step, in this order: queued reservations and handoffs try again for blocks; requests whose
KV arrived are promoted (``_update_waiting_for_remote_kv``: cache the valid prefix, then lower the
count, docs/semantics.md §6, §10.18); running requests decode one token each (a failed allocation
preempts the last running request, §8, §10.25); waiting requests are admitted in order until one
does not fit.  Every forward pass first records what KV it reads (``Computed``).
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.harness.pd import instance as I
from kvspec.harness.pd import messages as M
from kvspec.harness.pd.decode import release, try_load, try_reserve
from kvspec.harness.pd.state import ClusterState, Computed, DJob, DMode, InstanceState, emit, send, with_d, with_d_job
from kvspec.harness.pd.types import InstanceId
from kvspec.spec.request import RequestStatus
from kvspec.spec.types import RequestId

ROUTER = "router"


def _name(s: ClusterState, i: int) -> InstanceId:
    return s.ds[i].inst.name


def _with_inst(s: ClusterState, i: int, inst: InstanceState) -> ClusterState:
    return with_d(s, i, replace(s.ds[i], inst=inst))


def get_sampled_token(tokens: tuple[int, ...]) -> int:
    """The model's next token (deterministic, from a small alphabet so prefixes repeat)."""
    return 1 + (sum(tokens) + len(tokens)) % 3


def compute_valid_prefix(job: DJob, block_size: int) -> int:
    """Tokens whose KV arrived intact: the prompt, or up to the first block that failed."""
    if not job.failed:
        return len(job.prompt)
    return min(len(job.prompt), min(job.failed) * block_size)


def promote(s: ClusterState, i: int, job: DJob) -> ClusterState:
    """The transfer is over: publish what arrived, then make the request schedulable."""
    inst = s.ds[i].inst
    valid = compute_valid_prefix(job, I.get_block_size(inst))
    if valid == 0:  # nothing usable: free, and look up afresh (vLLM 0.33)
        inst = I.free(inst, job.rid)
        inst = I.set_num_computed(inst, job.rid, 0)
        mode: DMode = "local"
    else:
        inst = I.set_num_computed(inst, job.rid, valid)
        inst = I.cache(inst, job.rid, valid)
        if valid == inst.requests[job.rid].num_tokens:
            inst = I.set_num_computed(inst, job.rid, valid - 1)  # recompute one token to sample (§10.18)
        mode = job.mode
    inst = I.set_status(inst, job.rid, RequestStatus.WAITING)
    s = _with_inst(s, i, inst)
    return with_d_job(s, i, replace(job, phase="waiting", mode=mode))


def _forward(s: ClusterState, i: int, job: DJob, start: int, end: int) -> ClusterState:
    """A forward pass over ``[start, end)`` that samples one token at the end."""
    inst = s.ds[i].inst
    s = emit(s, Computed(job.rid, start, inst))
    inst = I.compute(inst, job.rid, start, end, s.options.num_layers)
    inst = I.set_num_computed(inst, job.rid, end)
    inst = I.append_token(inst, job.rid, get_sampled_token(inst.requests[job.rid].all_token_ids))
    s = _with_inst(s, i, inst)
    job = replace(job, generated=job.generated + 1)
    if job.generated == 1:
        s = send(s, _name(s, i), ROUTER, M.FirstToken(job.rid, _name(s, i)))
    if job.generated >= job.max_tokens:
        s = release(s, i, job.rid)
        return send(s, _name(s, i), ROUTER, M.Finished(job.rid, _name(s, i)))
    return with_d_job(s, i, job)


def preempt(s: ClusterState, i: int, rid: RequestId) -> ClusterState:
    """vLLM 0.33 preemption: free, computed count 0, to the front of the waiting queue."""
    inst = I.free(s.ds[i].inst, rid)
    inst = I.set_num_computed(inst, rid, 0)
    inst = I.set_status(inst, rid, RequestStatus.PREEMPTED)
    s = _with_inst(s, i, inst)
    d = s.ds[i]
    job = replace(d.jobs[rid], phase="waiting", mode="local")
    d = replace(
        d, running=tuple(r for r in d.running if r != rid), order=(rid,) + tuple(r for r in d.order if r != rid)
    )
    return with_d_job(with_d(s, i, d), i, job)


def decode_running(s: ClusterState, i: int) -> ClusterState:
    for rid in s.ds[i].running:
        while rid in s.ds[i].running:
            inst, new = I.allocate(s.ds[i].inst, rid, 1)
            s = _with_inst(s, i, inst)
            if new is not None:
                computed = inst.requests[rid].num_computed_tokens
                s = _forward(s, i, s.ds[i].jobs[rid], computed, computed + 1)
                break
            victim = s.ds[i].running[-1]
            s = preempt(s, i, victim)
    return s


def admit_waiting(s: ClusterState, i: int) -> ClusterState:
    """Requests that already hold KV (arrived loads) go first, as vLLM 0.33's ``kv_holding``
    queue does; then the rest, in order, until one does not fit."""
    d = s.ds[i]
    waiting = [r for r in d.order if r in d.jobs and d.jobs[r].phase == "waiting"]
    holders = [r for r in waiting if I.holds_blocks(d.inst, r)]
    for rid in holders + [r for r in waiting if r not in holders]:
        job = s.ds[i].jobs[rid]
        inst = s.ds[i].inst
        req = inst.requests[rid]
        hit = None
        if req.num_computed_tokens == 0:
            inst, hit = I.lookup(inst, rid)
        start = req.num_computed_tokens + (0 if hit is None else hit.num_hit_tokens)
        inst, new = I.allocate(inst, rid, req.num_tokens - start, hit)
        s = _with_inst(s, i, inst)
        if new is None:
            break  # vLLM: a waiting request that does not fit ends admissions for the step
        s = _with_inst(s, i, I.set_status(s.ds[i].inst, rid, RequestStatus.RUNNING))
        job = replace(job, phase="running")
        d = s.ds[i]
        s = with_d(with_d_job(s, i, job), i, replace(d, running=d.running + (rid,)))
        s = _forward(s, i, job, start, req.num_tokens)
    return s


def d_step(s: ClusterState, i: int) -> ClusterState:
    for rid in s.ds[i].order:
        job = s.ds[i].jobs.get(rid)
        if job is not None and job.phase == "queued":
            s = try_reserve(s, i, job, answer_failure=False) if job.mode == "push" else try_load(s, i, job)
    for rid in s.ds[i].order:
        job = s.ds[i].jobs.get(rid)
        if job is not None and job.phase == "arrived":
            s = promote(s, i, job)
    s = decode_running(s, i)
    return admit_waiting(s, i)
