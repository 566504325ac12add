"""The cluster's state: a value, like the spec manager's.

One ``InstanceState`` per instance (a spec ``KVCacheManagerState``, the requests it knows, and the
KV contents of its blocks), the roles' protocol bookkeeping (``PState``, ``DState``,
``RouterState``), the network (envelopes in flight), the clock, the release deadlines the
``released_within_bound`` rule watches, and the data-plane facts of the last transition
(``events``), which the invariants judge.  Updates build new values (``replace``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kvspec.harness.pd.messages import Content, Envelope, Message
from kvspec.harness.pd.types import PREFILL, Design, Epoch, InstanceId, LeaseId, Options, Tick
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.request import Request
from kvspec.spec.state import KVCacheManagerState
from kvspec.spec.types import BlockId, RequestId


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One engine's KV-cache manager and what it holds.

    ``incarnation[r]`` counts the times ``r`` went from holding nothing to holding blocks here;
    ``log`` lists the manager calls (a ``harness.core.ops`` operation and its outcome in JSON form)
    made since the harness last took them, so they can be replayed on a real manager.
    """

    name: InstanceId
    config: KVCacheConfig
    manager: KVCacheManagerState
    requests: Mapping[RequestId, Request]
    memory: Mapping[BlockId, Content | None]
    incarnation: Mapping[RequestId, int] = field(default_factory=dict)
    log: tuple[tuple[Any, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class PushTarget:
    lease: LeaseId
    d: InstanceId
    hit_tokens: int
    blocks: tuple[BlockId, ...]


PPhase = Literal["queued", "computing", "done"]


@dataclass(frozen=True, slots=True)
class PJob:
    """A request on the prefill instance."""

    rid: RequestId
    prompt: tuple[int, ...]
    phase: PPhase = "queued"
    target: PushTarget | None = None
    issued: frozenset[tuple[int, int]] = frozenset()  # (table index, layer) written so far
    outstanding: frozenset[tuple[int, int]] = frozenset()  # issued, completion not yet seen
    failed: frozenset[int] = frozenset()  # table indices whose write failed
    acks_due: tuple[tuple[LeaseId, InstanceId], ...] = ()  # revokes to acknowledge once drained
    aborted: bool = False
    done_sent: bool = False
    revoked: LeaseId | None = None  # the lease D revoked (reported with Prefilled)
    reported: bool = False  # Prefilled sent (pull handoff or push fallback)
    claimed: bool = False  # a decode instance will read (pull) or a target arrived (push)
    hold_until: Tick | None = None  # finished and unclaimed: the hold on the KV expires then


@dataclass(frozen=True, slots=True)
class PState:
    inst: InstanceState
    epoch: Epoch
    queue: tuple[RequestId, ...] = ()
    jobs: Mapping[RequestId, PJob] = field(default_factory=dict)
    revoked: frozenset[LeaseId] = frozenset()  # tombstones: a late Target for these is ignored
    aborted: frozenset[RequestId] = frozenset()  # tombstones: a Prefill overtaken by its Abort is ignored
    early_targets: Mapping[RequestId, Any] = field(default_factory=dict)  # a Target that overtook its Prefill


DPhase = Literal["queued", "reserved", "revoking", "loading", "arrived", "waiting", "running"]
DMode = Literal["push", "pull", "local"]


@dataclass(frozen=True, slots=True)
class DJob:
    """A request on a decode instance.

    ``push``: a reservation (``queued`` for blocks, ``reserved``, ``revoking``, then ``arrived``);
    ``pull``: a handoff (``queued``, ``loading``, ``arrived``); afterwards every job is ``waiting``
    (to be scheduled) or ``running`` (decoding); ``local`` jobs recompute on D.
    """

    rid: RequestId
    prompt: tuple[int, ...]
    max_tokens: int
    mode: DMode
    phase: DPhase
    epoch: Epoch
    lease: LeaseId | None = None
    hit_tokens: int = 0
    p_blocks: tuple[BlockId, ...] = ()
    outstanding: frozenset[int] = frozenset()  # pull: reads not yet landed
    failed: frozenset[int] = frozenset()
    deadline: Tick | None = None  # push: the reservation's time-out
    aborted: bool = False
    generated: int = 0


@dataclass(frozen=True, slots=True)
class DState:
    inst: InstanceState
    jobs: Mapping[RequestId, DJob] = field(default_factory=dict)
    order: tuple[RequestId, ...] = ()  # scheduling order (vLLM's waiting queue, then running)
    running: tuple[RequestId, ...] = ()
    cancelled: frozenset[tuple[RequestId, LeaseId]] = frozenset()
    aborted: frozenset[RequestId] = frozenset()
    fenced: frozenset[Epoch] = frozenset()
    handoffs: Mapping[RequestId, Any] = field(default_factory=dict)  # a Decode waiting for its revoked lease's release


RPhase = Literal["prefilling", "handed_off", "decoding", "done", "aborted"]


@dataclass(frozen=True, slots=True)
class RouterRecord:
    rid: RequestId
    prompt: tuple[int, ...]
    max_tokens: int
    epoch: Epoch
    phase: RPhase = "prefilling"
    leases: Mapping[LeaseId, InstanceId] = field(default_factory=dict)  # reservation attempts still open
    adopted: LeaseId | None = None
    pull: bool = False  # fall back to the pull handoff
    prefilled: tuple[BlockId, ...] | None = None
    tried: frozenset[InstanceId] = frozenset()
    d: InstanceId | None = None


@dataclass(frozen=True, slots=True)
class RouterState:
    records: Mapping[RequestId, RouterRecord] = field(default_factory=dict)
    next_lease: int = 1
    next_d: int = 0


@dataclass(frozen=True, slots=True)
class Trigger:
    """From ``tick`` on, blocks of ``rid`` must be released within the bound: on ``inst`` for its
    incarnation ``incarnation`` (a time-out), or everywhere and for good (``inst`` None: the
    request was aborted, failed or finished)."""

    rid: RequestId
    tick: Tick
    why: str
    inst: InstanceId | None = None
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class Landed:
    """Data landed in D's block ``dst`` for table ``index`` of ``rid``; ``d`` is D as it was then."""

    kind: Literal["write", "read"]
    rid: RequestId
    lease: LeaseId | None
    index: int
    dst: BlockId
    d: DState


@dataclass(frozen=True, slots=True)
class SourceRead:
    """A transfer read P's block ``src`` for table ``index`` of ``rid``; ``p`` is P as it was then."""

    rid: RequestId
    index: int
    src: BlockId
    epoch: Epoch
    p: PState


@dataclass(frozen=True, slots=True)
class Computed:
    """A forward pass on ``inst`` read the KV of ``rid``'s first ``upto`` tokens."""

    rid: RequestId
    upto: int
    inst: InstanceState


Event = Landed | SourceRead | Computed


@dataclass(frozen=True, slots=True)
class ClusterState:
    design: Design
    options: Options
    now: Tick
    router: RouterState
    p: PState
    ds: tuple[DState, ...]
    network: tuple[Envelope, ...] = ()
    next_mid: int = 0
    triggers: tuple[Trigger, ...] = ()
    events: tuple[Event, ...] = ()


# --- small helpers ------------------------------------------------------------------------------


def get_decoder_names(s: ClusterState) -> tuple[InstanceId, ...]:
    return tuple(d.inst.name for d in s.ds)


def get_d_index(s: ClusterState, name: InstanceId) -> int:
    for i, d in enumerate(s.ds):
        if d.inst.name == name:
            return i
    raise ValueError(f"no decode instance {name!r}")


def get_instances(s: ClusterState) -> tuple[InstanceState, ...]:
    return (s.p.inst,) + tuple(d.inst for d in s.ds)


def send(s: ClusterState, src: InstanceId | str, dst: InstanceId | str, msg: Message) -> ClusterState:
    env = Envelope(s.next_mid, src, dst, s.now, msg)
    return replace(s, network=s.network + (env,), next_mid=s.next_mid + 1)


def send_to_p(s: ClusterState, src: InstanceId | str, msg: Message) -> ClusterState:
    return send(s, src, PREFILL, msg)


def with_d(s: ClusterState, i: int, d: DState) -> ClusterState:
    return replace(s, ds=s.ds[:i] + (d,) + s.ds[i + 1 :])


def with_d_job(s: ClusterState, i: int, job: DJob | None, rid: RequestId | None = None) -> ClusterState:
    """Put ``job`` into decode instance ``i`` (or drop ``rid``'s job when ``job`` is None)."""
    d = s.ds[i]
    jobs = dict(d.jobs)
    if job is None:
        assert rid is not None
        jobs.pop(rid, None)
        d = replace(
            d, jobs=jobs, order=tuple(r for r in d.order if r != rid), running=tuple(r for r in d.running if r != rid)
        )
    else:
        jobs[job.rid] = job
        d = replace(d, jobs=jobs)
    return with_d(s, i, d)


def with_p_job(s: ClusterState, job: PJob | None, rid: RequestId | None = None) -> ClusterState:
    jobs = dict(s.p.jobs)
    if job is None:
        assert rid is not None
        jobs.pop(rid, None)
        return replace(s, p=replace(s.p, jobs=jobs, queue=tuple(r for r in s.p.queue if r != rid)))
    jobs[job.rid] = job
    return replace(s, p=replace(s.p, jobs=jobs))


def with_record(s: ClusterState, rec: RouterRecord) -> ClusterState:
    records = dict(s.router.records)
    records[rec.rid] = rec
    return replace(s, router=replace(s.router, records=records))


def emit(s: ClusterState, event: Event) -> ClusterState:
    return replace(s, events=s.events + (event,))


def add_trigger(s: ClusterState, trigger: Trigger) -> ClusterState:
    return replace(s, triggers=s.triggers + (trigger,))


def is_live_request(s: ClusterState, rid: RequestId) -> bool:
    rec = s.router.records.get(rid)
    return rec is not None and rec.phase not in ("done", "aborted")
