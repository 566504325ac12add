"""What the search checks: the fuzzed designs, vLLM's real baselines, and the deliberate bugs.

``VLLM_PUSH`` and ``VLLM_PULL`` are what vLLM 0.33.0 and 0.34.0 do (their NIXL connector's push
and pull modes, the scheduler's free path, and the push proxy of vLLM's NIXL tests; the two
releases agree on every decision below, docs/pd-preallocation.md §vLLM's baseline): the proxy
sends the request to D only once P answered (``dispatch="sequential"``); D keeps a request it
has no block for in its waiting queue (``queue_when_full``: it refuses nothing, so the router's
retry never runs); an abort that reaches P after its prefill finds a finished request and changes
nothing (P's lease keeps the KV, and a registration still gets its write); D registers its blocks
with P as soon as it allocated them; a request aborted while waiting for remote KV has its free
delayed until the transfer reports done; D's push watchdog only drops the pending registration
(it frees nothing); P's hold on finished KV is a lease that D's heartbeats extend, and it frees
the KV when it runs out even if a transfer is still reading it; nothing fences a failed P.
tests/pd/test_mc_vllm_designs.py derives these flags from vLLM's real ``Scheduler`` and NIXL
connector scheduler side, and replays recorded runs as traces of the model; its docstring lists
the flags that rest on worker code instead.

``AS_WRITTEN`` is the seed's proposal on vLLM's own rules: vLLM's push with the one change the
seed asks for, the router sending to P and D at once.  Nothing else is added, so it keeps vLLM's
delayed free (no free on a time-out: the seed does not ask for one).  The ``-timed`` variants
assume P's lease outlives the handoff and every transfer (what heartbeats buy when nothing stalls
for ``kv_lease_duration``).

``MC_BUGS`` are the bugs of ``designs.BUGS`` that the abstract model can express, plus one for
each fault kind the fuzz does not inject (loss, restart, an expiring lease).
"""

from __future__ import annotations

from dataclasses import replace

from kvspec.harness.pd.designs import BASELINE, BUGS, PROPOSAL, Bug, resolve_design
from kvspec.harness.pd.types import Design

VLLM_PUSH = replace(
    PROPOSAL,
    name="vllm-push",
    dispatch="sequential",
    queue_when_full=True,
    abort_reaches_finished_p=False,
    timeout_releases=False,
    revoke=False,
    fence_on_peer_failure=False,
    hold_outlives_transfers=False,
)
VLLM_PULL = replace(
    BASELINE,
    name="vllm-pull",
    queue_when_full=True,
    abort_reaches_finished_p=False,
    fence_on_peer_failure=False,
    hold_outlives_transfers=False,
)
AS_WRITTEN = replace(VLLM_PUSH, name="as-written", dispatch="concurrent")

# The same, with the lease assumed long enough to outlive the handoff and every transfer.
VLLM_PUSH_TIMED = replace(VLLM_PUSH, name="vllm-push-timed", hold_outlives_transfers=True)
VLLM_PULL_TIMED = replace(VLLM_PULL, name="vllm-pull-timed", hold_outlives_transfers=True)
AS_WRITTEN_TIMED = replace(AS_WRITTEN, name="as-written-timed", hold_outlives_transfers=True)

MC_DESIGNS = {
    d.name: d
    for d in (
        BASELINE,
        PROPOSAL,
        AS_WRITTEN,
        AS_WRITTEN_TIMED,
        VLLM_PUSH,
        VLLM_PULL,
        VLLM_PUSH_TIMED,
        VLLM_PULL_TIMED,
    )
}

_NEW = (
    Bug(
        "no-revoke-resend",
        PROPOSAL,
        {"resend_revoke": False},
        "reservation_released_or_used",
        "D sends its Revoke once: if it or the acknowledgement is lost, the reservation is held forever",
    ),
    Bug(
        "hold-expires-while-writing",
        PROPOSAL,
        {"hold_outlives_transfers": False},
        "transfer_source_held",
        "P's hold on its KV expires on a timer, writes in flight or not (vLLM 0.33's lease): "
        "a write reads freed blocks",
    ),
    Bug(
        "restart-keeps-registration",
        PROPOSAL,
        {"fence_restarted_d": False},
        "write_lands_in_held_block",
        "a restarted D keeps the old memory registration: a write meant for its previous life lands in a reused block",
    ),
    Bug(
        "ack-from-any-incarnation",
        PROPOSAL,
        {"ack_names_incarnation": False},
        "write_lands_in_held_block",
        "D releases on a restarted P's acknowledgement: the new incarnation speaks for its own writes only, "
        "and the failed one's write, not yet fenced, lands in the released block",
    ),
    Bug(
        "reserve-past-capacity",
        PROPOSAL,
        {"reserve_within_capacity": False},
        "blocks_within_capacity",
        "D reserves for a second request while its only block is held: two transfers land in one block "
        "(only two contending requests reach it: the contention bounds)",
    ),
    Bug(
        "pull-frees-while-reading",
        BASELINE,
        {"defer_free_while_loading": False},
        "write_lands_in_held_block",
        "pull: D frees an aborted request's blocks while its reads are in flight (vLLM delays that free)",
    ),
)
# The fuzz's bugs, but one: ``no-cancel-on-abort`` is no bug here, as P's abort acknowledges
# the registered D (an amendment the search found needed: a D restart loses the Cancel's tombstone).
MC_BUGS = {b.name: b for b in (*BUGS.values(), *_NEW) if b.name != "no-cancel-on-abort"}
MC_BUG_RULE = {"no-fence": "reservation_released_or_used"}
"""The rule the search reaches where the fuzz's own rule has no counterpart here: without the
fence, a reservation waiting for a crashed P is released by nothing (the restarted P's
acknowledgement speaks only for its own writes), the search's liveness rule."""


CONTENTION_BUGS = frozenset({"reserve-past-capacity"})
"""Bugs only two requests contending for a block reach (``harness.pd.mc.model.CONTENTION``)."""


def expected_rule(bug: Bug) -> str:
    return MC_BUG_RULE.get(bug.name, bug.invariant)


def resolve_mc_design(name: str) -> Design:
    """A design of ``MC_DESIGNS`` or ``bug:NAME`` of ``MC_BUGS``; ``ValueError`` names the choices."""
    return resolve_design(name, MC_DESIGNS, MC_BUGS)
