"""Ids, time, and the decisions a P/D protocol makes.

Distinct types keep the roles apart: an instance name, a lease (one reservation attempt on one
decode instance), a prefill incarnation (``Epoch``: a restarted or fenced prefill instance is a
new one), and a logical clock (``Tick``).  ``Design`` lists every decision a real design has to
make; the protocols of ``designs`` are values of it, and each deliberate bug flips one field.
``Options`` are the choices a deployment makes that must all be safe (the fuzzer draws them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NewType

InstanceId = NewType("InstanceId", str)
"""``"P"`` (the prefill instance) or ``"D0"``, ``"D1"``, ... (decode instances)."""

LeaseId = NewType("LeaseId", int)
"""One reservation attempt: issued by the router, unique in a run."""

Epoch = NewType("Epoch", int)
"""The prefill instance's incarnation; bumped when it fails (its in-flight messages keep the old one)."""

Tick = NewType("Tick", int)
"""Logical time.  Every message is delivered within ``Timing.max_delay`` ticks of being sent."""

PREFILL = InstanceId("P")

Transfer = Literal["pull", "push"]
Release = Literal["immediate", "after_writer"]
OnReserveFail = Literal["queue", "retry", "baseline"]
Stream = Literal["end", "layerwise"]
Dispatch = Literal["concurrent", "sequential"]


@dataclass(frozen=True, slots=True)
class Timing:
    """Bounds of the model's partial synchrony (all in ticks).

    ``max_delay``: every message is delivered within this many ticks (the network may reorder).
    ``lease``: a decode instance's reservation time-out (covers the prefill queue: long).
    ``hold``: the prefill instance's hold on finished KV that no decode instance claimed
    (vLLM 0.33 NIXL ``kv_lease_duration``, renewed by the decode side's heartbeats).
    """

    max_delay: int = 2
    lease: int = 24
    hold: int = 8

    @property
    def release_bound(self) -> int:
        """Ticks within which blocks held for an aborted, failed, finished or timed-out request
        must be released: the revoke handshake (cancel, revoke, last write, its completion, the
        ack: five deliveries) or the prefill hold plus one delivery, whichever is longer."""
        return max(5 * self.max_delay, self.hold + self.max_delay) + 1


@dataclass(frozen=True, slots=True)
class Design:
    """The decisions of a P/D protocol.  docs/pd-preallocation.md explains each one."""

    name: str
    transfer: Transfer  # pull: D reads P's blocks after prefill (vLLM 0.33); push: P writes D's reservation
    # --- decode side -----------------------------------------------------------------------
    release: Release = "after_writer"  # free a reservation only when no write can still land
    fence_on_peer_failure: bool = True  # a failed P's in-flight writes are dropped before release
    d_tombstones_cancelled: bool = True  # a Cancel that overtakes its Reserve blocks it
    publish_on_arrival: bool = True  # reserve with delay_cache_blocks; cache_blocks only on arrival
    wait_for_arrival: bool = True  # a reservation is not scheduled before its KV arrived
    defer_free_while_loading: bool = True  # pull: an abort during the reads frees after them (§6)
    free_on_release: bool = True  # (an implementation slip when False: the lease record goes, the blocks stay)
    # --- prefill side ----------------------------------------------------------------------
    p_tombstones_revoked: bool = True  # a Target that arrives after its Revoke is ignored
    skip_d_hits: bool = True  # write only the blocks past D's own prefix hit
    done_after_completions: bool = True  # Done (and the free of the sources) waits for every write's completion
    producer_delayed_free: bool = True  # pull: P keeps finished KV until D read it (or the hold ends)
    # --- router ----------------------------------------------------------------------------
    cancel_on_abort: bool = True  # an abort cancels every reservation the request holds
    # --- decisions only the exhaustive search (``harness.pd.mc``) models -------------------
    timeout_releases: bool = True  # a reservation's time-out starts its release (vLLM 0.33 push: a soft watchdog)
    revoke: bool = True  # a cancelled reservation is revoked at P (vLLM 0.33: freed on P's completion notice)
    resend_revoke: bool = True  # D resends an unanswered Revoke (messages may be lost)
    hold_outlives_transfers: bool = True  # P's hold on its KV never expires while a transfer reads it
    fence_restarted_d: bool = True  # a restarted D's memory is a new registration: old writes cannot land
    reserve_within_capacity: bool = (
        True  # D refuses a reservation when every block is held (the fuzz's spec manager refuses on its own)
    )
    queue_when_full: bool = False  # D keeps a request it has no block for in its queue (vLLM) instead of refusing
    ack_names_incarnation: bool = True  # D releases on an acknowledgement only from the P incarnation it waits for
    abort_reaches_finished_p: bool = True  # an abort after P's prefill stops P (vLLM: it finds a finished request)
    dispatch: Dispatch = "concurrent"  # push: the router sends to P and D at once, or to D after P answered (vLLM)

    @property
    def is_push(self) -> bool:
        return self.transfer == "push"


@dataclass(frozen=True, slots=True)
class Options:
    """Deployment choices every safe design must survive (the fuzzer draws them)."""

    num_decoders: int = 1
    on_reserve_fail: OnReserveFail = "baseline"  # D out of blocks: queue there, try another D, or pull
    stream: Stream = "end"  # push: write each layer as P computes it, or everything at the end
    num_layers: int = 2
    chunk_tokens: int = 8  # prefill tokens per P step (chunked prefill)
    timing: Timing = Timing()
