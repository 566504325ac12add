"""The safety rules of P/D transfer, each a named predicate in one registry (``PD_INVARIANTS``).

Checked after every transition (``check_pd_invariants``), in registry order.  Three kinds:
``event`` rules judge the data-plane facts of the transition (a transfer landing or reading its
source, a forward pass reading KV), each against the instance *as it was at that moment*; ``state``
rules judge the cluster after it; the ``idle`` rule judges the cluster once ``drain`` has run it to
rest.  The rules speak about ground truth (the managers' tables and the blocks' contents), not
about what the protocol believes.  docs/pd-preallocation.md states them; ``designs.BUGS`` holds a
deliberate bug for each.  ``PD_INVARIANTS`` is a ``spec.registry.Registry``, the type of the spec's
and the ledger's sets: a rule is added with ``@PD_INVARIANTS.register(rule, kind)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from kvspec.harness.pd import instance as I
from kvspec.harness.pd.cluster import is_idle
from kvspec.harness.pd.state import ClusterState, Computed, InstanceState, Landed, SourceRead
from kvspec.spec import block_pool
from kvspec.spec.invariants import check_invariants
from kvspec.spec.registry import Registry
from kvspec.spec.types import BlockId

Kind = Literal["event", "state", "idle"]

# The manager's own rules that protocol code can break from outside (docs/semantics.md §9.2-§9.5, §9.9).
MANAGER_RULES = (
    "free_queue_well_formed",
    "free_iff_unreferenced",
    "conservation",
    "ref_count_equals_references",
    "hash_map_matches_blocks",
)


@dataclass(frozen=True, slots=True)
class PDViolation:
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


PD_INVARIANTS: Registry[ClusterState, str] = Registry("P/D invariant", get_args(Kind))


def _describe(inst: InstanceState, block: int) -> str:
    pool = inst.manager.pool
    owners = [r for r, t in inst.manager.groups[0].req_to_blocks.items() if block in t]
    state = "free" if pool.ref_cnt[block] == 0 else f"held by {', '.join(sorted(owners))}"
    return state + (", published" if pool.block_key[block] is not None else "")


@PD_INVARIANTS.register(
    "every write lands in a block that the request holds on D at that moment, for that transfer",
    "event",
)
def write_lands_in_held_block(s: ClusterState) -> str | None:
    for ev in s.events:
        if not isinstance(ev, Landed):
            continue
        inst = ev.d.inst
        table = I.get_table(inst, ev.rid)
        job = ev.d.jobs.get(ev.rid)
        what = f"{ev.kind} of {ev.rid} index {ev.index}" + (f" (lease {ev.lease})" if ev.lease is not None else "")
        where = f"{inst.name} block {ev.dst} ({_describe(inst, ev.dst)})"
        if ev.index >= len(table) or table[ev.index] != ev.dst:
            return f"{what} landed in {where}, not in {ev.rid}'s table at that index"
        if inst.manager.pool.ref_cnt[ev.dst] != 1 or inst.manager.pool.block_key[ev.dst] is not None:
            return f"{what} landed in {where}: a shared or published block (a prefix hit) was overwritten"
        if ev.kind == "write":
            if job is None or job.lease != ev.lease or job.phase not in ("reserved", "revoking"):
                return f"{what} landed in {where}, but that reservation is no longer awaiting it"
        elif job is None or job.phase != "loading":
            return f"{what} landed in {where}, but that load is no longer awaiting it"
    return None


@PD_INVARIANTS.register(
    "every transfer reads a source block that the request holds on a live P at that moment",
    "event",
)
def transfer_source_held(s: ClusterState) -> str | None:
    for ev in s.events:
        if not isinstance(ev, SourceRead) or ev.p.epoch != ev.epoch:
            continue
        table = I.get_table(ev.p.inst, ev.rid)
        if ev.index >= len(table) or table[ev.index] != ev.src:
            return f"a transfer of {ev.rid} index {ev.index} read P block {ev.src} ({_describe(ev.p.inst, ev.src)})"
    return None


@PD_INVARIANTS.register(
    "a published (hashed) block holds every layer of the KV its hash names: nothing is published before it arrived",
    "state",
)
def published_only_after_arrival(s: ClusterState) -> str | None:
    for inst in (s.p.inst,) + tuple(d.inst for d in s.ds):
        prefixes = I.get_published_prefixes(inst)
        for b, key in enumerate(inst.manager.pool.block_key):
            if key is None:
                continue
            want = prefixes.get(bytes(key))
            if want is None or not I.holds_kv(inst.memory.get(BlockId(b)), want, len(want), s.options.num_layers):
                got = inst.memory.get(BlockId(b))
                return f"{inst.name} block {b} is published for tokens {want} but holds {got}"
    return None


@PD_INVARIANTS.register(
    "a forward pass reads only KV that has arrived (every layer, the request's own tokens)",
    "event",
)
def read_only_after_arrival(s: ClusterState) -> str | None:
    for ev in s.events:
        if not isinstance(ev, Computed):
            continue
        inst = ev.inst
        bs = I.get_block_size(inst)
        tokens = inst.requests[ev.rid].all_token_ids
        table = I.get_table(inst, ev.rid)
        for i in range(-(-ev.upto // bs)):
            upto = min((i + 1) * bs, ev.upto)
            if not I.holds_kv(inst.memory.get(table[i]), tokens, upto, s.options.num_layers):
                return (
                    f"{inst.name} computed {ev.rid} reading block {table[i]} "
                    f"(index {i}), which holds {inst.memory.get(table[i])}"
                )
    return None


@PD_INVARIANTS.register(
    "blocks held for an aborted, failed, finished or timed-out request are released within Timing.release_bound ticks",
    "state",
)
def released_within_bound(s: ClusterState) -> str | None:
    bound = s.options.timing.release_bound
    instances = (s.p.inst,) + tuple(d.inst for d in s.ds)
    for t in s.triggers:
        if s.now <= t.tick + bound:
            continue
        for inst in instances:
            if t.inst is not None and (inst.name != t.inst or inst.incarnation.get(t.rid) != t.incarnation):
                continue
            if I.holds_blocks(inst, t.rid):
                n = len(I.get_table(inst, t.rid))
                return (
                    f"{inst.name} still holds {n} block(s) of {t.rid} "
                    f"{s.now - t.tick} ticks after its {t.why} (bound {bound})"
                )
    return None


@PD_INVARIANTS.register(
    "on every instance the manager's own rules hold and every "
    "block table belongs to a request the instance still tracks",
    "state",
)
def instance_conservation(s: ClusterState) -> str | None:
    roles = [(s.p.inst, set(s.p.jobs))] + [(d.inst, set(d.jobs)) for d in s.ds]
    for inst, tracked in roles:
        for v in check_invariants(inst.manager, inst.requests, names=MANAGER_RULES):
            return f"{inst.name}: {v.name}: {v.message}"
        orphans = sorted(set(inst.manager.groups[0].req_to_blocks) - tracked)
        if orphans:
            return f"{inst.name} holds blocks of {', '.join(orphans)}, which it no longer tracks (a leak)"
    return None


@PD_INVARIANTS.register(
    "at rest (no live request, nothing in flight) every instance has all its blocks free",
    "idle",
)
def no_leak_at_idle(s: ClusterState) -> str | None:
    if not is_idle(s):
        live = sorted(r for r, rec in s.router.records.items() if rec.phase not in ("done", "aborted"))
        jobs = sorted(f"{d.inst.name}:{r}:{j.phase}" for d in s.ds for r, j in d.jobs.items())
        jobs += sorted(f"P:{r}:{j.phase}" for r, j in s.p.jobs.items())
        return (
            f"the cluster did not come to rest: live requests {live}, "
            f"jobs {jobs}, {len(s.network)} message(s) in flight"
        )
    for inst in (s.p.inst,) + tuple(d.inst for d in s.ds):
        free = block_pool.get_num_free_blocks(inst.manager.pool)
        held = sorted(inst.manager.groups[0].req_to_blocks)
        if free != inst.config.num_blocks - 1 or held:
            return f"{inst.name} at rest: {free} of {inst.config.num_blocks - 1} blocks free, tables of {held}"
    return None


def check_pd_invariants(s: ClusterState, names: Sequence[str] | None = None, idle: bool = False) -> list[PDViolation]:
    """The violations of the registered rules (or of ``names``); the ``idle`` rule only when
    ``idle`` (the state is the result of ``drain``)."""
    kinds = ("idle",) if idle else ("event", "state")
    return [PDViolation(inv.name, message) for inv, message in PD_INVARIANTS.check(s, names, kinds)]
