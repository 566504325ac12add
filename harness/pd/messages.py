"""The messages of both protocols.  Each travels in an ``Envelope`` through the network of
``harness.pd.state``, which may delay it (up to ``Timing.max_delay`` ticks) and reorder it.

Control plane: router <-> prefill instance (P) and router <-> decode instances (D).  Data plane:
``Write`` (push: a one-sided RDMA write of one layer of one block into D's memory), its NIC
completion ``WriteDone``, and ``Read`` / ``ReadData`` (pull, vLLM 0.33 NIXL: D reads P's blocks).
Messages addressed to P carry the P incarnation (``epoch``) they were meant for; a restarted P
drops the rest.  Block ids are those of the instance that chose them: D's manager chooses D's
block ids, never the router (so two routers cannot book one block twice).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.harness.pd.types import Epoch, InstanceId, LeaseId, Tick
from kvspec.spec.types import BlockId, RequestId

Content = tuple[tuple[int, ...], frozenset[int]]
"""What a block of KV memory holds: the token prefix its KV was computed for (up to the block's
last written token) and the layers present.  ``None`` stands for a fresh block (garbage)."""


# --- router -> P -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prefill:
    rid: RequestId
    prompt: tuple[int, ...]
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class Target:
    """Push: where to write.  ``blocks`` is D's whole table for the request; the first
    ``hit_tokens // block_size`` are D's own prefix hit, which P must not write."""

    rid: RequestId
    lease: LeaseId
    d: InstanceId
    hit_tokens: int
    blocks: tuple[BlockId, ...]
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class Abort:
    rid: RequestId
    epoch: Epoch | None = None  # set when addressed to P
    handed_off: bool = False  # to P: a decode instance was given the request and may still read


# --- P -> router -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prefilled:
    """P's KV is complete and held in ``blocks`` (pull handoff, or the push fallback)."""

    rid: RequestId
    epoch: Epoch
    blocks: tuple[BlockId, ...]
    revoked: LeaseId | None = None  # push: the lease D revoked (so the router falls back to pull)


@dataclass(frozen=True, slots=True)
class PushLost:
    """P's lease was revoked after P had already released its KV: the request must start over."""

    rid: RequestId
    lease: LeaseId


# --- router <-> D ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reserve:
    rid: RequestId
    lease: LeaseId
    prompt: tuple[int, ...]
    epoch: Epoch
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Reserved:
    rid: RequestId
    lease: LeaseId
    d: InstanceId
    hit_tokens: int
    blocks: tuple[BlockId, ...]


@dataclass(frozen=True, slots=True)
class ReserveFailed:
    rid: RequestId
    lease: LeaseId
    d: InstanceId


@dataclass(frozen=True, slots=True)
class Cancel:
    rid: RequestId
    lease: LeaseId


@dataclass(frozen=True, slots=True)
class Decode:
    """Pull handoff (vLLM 0.33 today): the request with P's ``kv_transfer_params``."""

    rid: RequestId
    prompt: tuple[int, ...]
    epoch: Epoch
    blocks: tuple[BlockId, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class FirstToken:
    rid: RequestId
    d: InstanceId


@dataclass(frozen=True, slots=True)
class Finished:
    rid: RequestId
    d: InstanceId


# --- data plane and its control --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Write:
    """One layer of one block, from P's block ``src`` into D's block ``dst`` (table ``index``)."""

    rid: RequestId
    lease: LeaseId
    epoch: Epoch
    index: int
    layer: int
    src: BlockId
    dst: BlockId
    d: InstanceId
    ok: bool = True  # False: the transfer failed (error completion; nothing lands)


@dataclass(frozen=True, slots=True)
class WriteDone:
    rid: RequestId
    lease: LeaseId
    epoch: Epoch
    index: int
    layer: int
    ok: bool


@dataclass(frozen=True, slots=True)
class Done:
    """Push: every write of the lease has completed; ``failed`` are the table indices that did not land."""

    rid: RequestId
    lease: LeaseId
    epoch: Epoch
    failed: frozenset[int]


@dataclass(frozen=True, slots=True)
class Revoke:
    rid: RequestId
    lease: LeaseId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class RevokeAck:
    """P will issue no further write for the lease, and every issued one has completed."""

    rid: RequestId
    lease: LeaseId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class Read:
    """Pull: D asks P's NIC for block ``src`` (table ``index``), to land in D's ``dst``."""

    rid: RequestId
    epoch: Epoch
    index: int
    src: BlockId
    dst: BlockId
    d: InstanceId


@dataclass(frozen=True, slots=True)
class ReadData:
    rid: RequestId
    epoch: Epoch
    index: int
    dst: BlockId
    content: Content | None
    ok: bool = True


@dataclass(frozen=True, slots=True)
class ReadDone:
    """Pull: D has read everything (or gave up): P may free (vLLM 0.33 NIXL's notification)."""

    rid: RequestId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """From D (pull): D has the request and will read it, so P's hold does not expire (vLLM 0.33
    NIXL heartbeats).  From the router (push): a reservation is still being sought; P extends its
    hold to a reservation's time-out."""

    rid: RequestId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class PeerFailed:
    """The failure detector declared P incarnation ``epoch`` failed (it may still be sending)."""

    epoch: Epoch


Message = (
    Prefill
    | Target
    | Abort
    | Prefilled
    | PushLost
    | Reserve
    | Reserved
    | ReserveFailed
    | Cancel
    | Decode
    | FirstToken
    | Finished
    | Write
    | WriteDone
    | Done
    | Revoke
    | RevokeAck
    | Read
    | ReadData
    | ReadDone
    | Heartbeat
    | PeerFailed
)


@dataclass(frozen=True, slots=True)
class Envelope:
    mid: int
    src: InstanceId | str
    dst: InstanceId | str
    sent: Tick
    msg: Message
