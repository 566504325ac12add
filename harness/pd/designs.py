"""The protocols, and the deliberate bugs that show each safety rule can fail.

- ``BASELINE``: vLLM 0.33 today.  P prefills and holds its KV (delayed free under a lease that D's
  heartbeats renew); the router then hands the request to D, which allocates with
  ``delay_cache_blocks``, pulls, caches on arrival (docs/semantics.md §6).
- ``PROPOSAL``: the amended proposal.  The one change: D releases a reservation only when no
  write to it can still land (P's ``Done`` or ``RevokeAck``, each sent after P's write completions,
  or a fence that cut off a failed P).

A bug is one decision of a safe design flipped; ``BUGS`` names the rule that must catch it.
``release-on-cancel`` is the implementation that frees a reservation as soon as it is cancelled
or timed out: the seed does not say so, and vLLM does not do it (it delays the free), but it is
the first thing a reservation with a time-out invites.  The seed's design on vLLM's own rules is
``as-written`` of the exhaustive search (``harness.pd.mc.designs``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvspec.harness.pd.types import Design

BASELINE = Design("baseline", "pull")
PROPOSAL = Design("proposal", "push")

DESIGNS = {d.name: d for d in (BASELINE, PROPOSAL)}


@dataclass(frozen=True, slots=True)
class Bug:
    name: str
    base: Design
    changes: dict[str, object]
    invariant: str  # the rule that must catch it
    what: str

    @property
    def design(self) -> Design:
        return replace(self.base, name=f"bug:{self.name}", **self.changes)  # type: ignore[arg-type]


BUGS = {
    b.name: b
    for b in (
        Bug(
            "release-on-cancel",
            PROPOSAL,
            {"release": "immediate"},
            "write_lands_in_held_block",
            "D frees a reservation on cancel or time-out without "
            "waiting for P: a write in flight lands in a freed block",
        ),
        Bug(
            "no-revoke-tombstone",
            PROPOSAL,
            {"p_tombstones_revoked": False},
            "write_lands_in_held_block",
            "P accepts a Target that arrives after its Revoke and writes into blocks D already released",
        ),
        Bug(
            "write-d-hits",
            PROPOSAL,
            {"skip_d_hits": False},
            "write_lands_in_held_block",
            "P writes every block, D's own prefix hit too: shared, published blocks get overwritten",
        ),
        Bug(
            "producer-frees-at-finish",
            BASELINE,
            {"producer_delayed_free": False},
            "transfer_source_held",
            "P frees its KV when the prefill finishes: D later reads blocks P has reused",
        ),
        Bug(
            "done-before-completions",
            PROPOSAL,
            {"done_after_completions": False},
            "published_only_after_arrival",
            "P sends Done once its writes are issued, not completed: "
            "Done overtakes a write and D publishes an empty block",
        ),
        Bug(
            "schedule-before-arrival",
            PROPOSAL,
            {"wait_for_arrival": False, "publish_on_arrival": False},
            "read_only_after_arrival",
            "D treats the reservation like a synchronous load and schedules "
            "it at once: the forward pass reads KV not yet written",
        ),
        Bug(
            "no-cancel-on-abort",
            PROPOSAL,
            {"cancel_on_abort": False},
            "released_within_bound",
            "the router does not cancel reservations when a request is aborted: D holds them until the lease times out",
        ),
        Bug(
            "forget-free",
            PROPOSAL,
            {"free_on_release": False},
            "instance_conservation",
            "D drops a released reservation's record but never calls free: its blocks belong to no live request",
        ),
        Bug(
            "no-fence",
            PROPOSAL,
            {"fence_on_peer_failure": False},
            "no_leak_at_idle",
            "D ignores P's failure: a reservation being revoked waits for an acknowledgement that never comes",
        ),
    )
}


def resolve_design(name: str, designs: dict[str, Design] = DESIGNS, bugs: dict[str, Bug] = BUGS) -> Design:
    """A design of ``designs`` (``baseline``, ``proposal``) or ``bug:NAME`` of
    ``bugs``; ``ValueError`` names the choices."""
    if name in designs:
        return designs[name]
    if name.startswith("bug:") and name[4:] in bugs:
        return bugs[name[4:]].design
    known = ", ".join(list(designs) + [f"bug:{b}" for b in bugs])
    raise ValueError(f"unknown design {name!r} (known: {known})")
