"""The KV ledger on any target: ``spec.kv_ledger`` fed from the target's observed block tables.

``LedgerChecker`` follows one run: every operation goes through the op -> KV-event mapping the torch
oracle uses (``harness.ledger.schedule``), and ``LedgerEvents`` turns its events into ledger writes,
clears and checked reads (docs/semantics.md §11): a model run writes the identities of the positions
it computes and reads the attention span of each, a connector load writes what it delivers, a fresh
or keyless-released block becomes unwritten, a publication is checked against what its slots hold.
Only the positions an event touches are visited.  ``harness.check.lockstep`` runs it after every
operation of ``kvspec fuzz`` (on by default); ``LedgerCheckTarget`` wraps a target like the oracle
does, raising ``LedgerMismatch``.

Steps: within one engine step the scheduler emits every model run of the step in execution order
(allocation order), so a run's reads are checked when it happens; a later write in the same step
that changes a slot already read is reported against that read (a batched forward pass reads what
every write of the step left, §11.2).  The step ends at the first operation that is not a
``SetNumComputedTokens`` / ``SetNumInFlightTokens``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.observation import Observation
from kvspec.harness.ledger.finding import LedgerFinding, LedgerMismatch, group_sizes
from kvspec.harness.ledger.request import Alloc, ScheduledRequest
from kvspec.harness.ledger.schedule import KVSchedule, ModelRun, Publication
from kvspec.harness.ledger.world import WorldFacts
from kvspec.harness.targets.base import Target
from kvspec.spec.config import AttentionSpec, KVCacheConfig
from kvspec.spec.hashing import HashFeatures, MMFeature
from kvspec.spec.kv_ledger import (
    AccessKind,
    IdentityTrie,
    KVIdentity,
    KVLedger,
    LedgerContext,
    LedgerViolation,
    SequenceIdentities,
    SlotAccess,
    check_ledger,
    clear_block,
    get_first_reader,
    get_held,
    get_run_span,
    get_written_blocks,
    write_slot,
)
from kvspec.spec.types import BlockId

STEP_OPS = (O.SetNumComputedTokens, O.SetNumInFlightTokens)  # a step's model runs, in order


@dataclass(eq=False)
class LedgerRequest(ScheduledRequest):
    """The mapping's request plus its identities and encoder input (cross attention)."""

    ids: SequenceIdentities | None = None
    encoder: tuple[MMFeature, ...] = ()
    encoder_len: int = 0  # encoder positions its cross-attention table holds
    encoder_written: Alloc | None = None  # the allocation whose encoder KV was written

    def identities(self, end: int) -> list[KVIdentity]:
        assert self.ids is not None
        return self.ids.get_identities(self.known_tokens(), self.rec.num_tokens, end)


class LedgerBroken(Exception):
    """Raised inside the events at the first violation; the checker turns it into a finding."""

    def __init__(
        self, violation: LedgerViolation, kind: AccessKind, request: LedgerRequest, run: ModelRun | None
    ) -> None:
        super().__init__(str(violation))
        self.violation, self.kind, self.request, self.run = violation, kind, request, run


class LedgerEvents:
    """The consumer of ``KVSchedule`` events that keeps the ledger (``KVEvents[LedgerRequest]``)."""

    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.trie = IdentityTrie()
        self.ledger = KVLedger()
        self.obs: Observation | None = None
        self.before: Observation | None = None  # what was shared or published when the op began
        self.step_reads: dict[tuple[int, int], tuple[SlotAccess, LedgerRequest]] = {}
        # publications whose slots are due after the request's model run, with the key they had
        self.promised: dict[str, list[tuple[Publication, bytes | None]]] = {}
        self.world: WorldFacts | None = None  # the world's load facts, when a driver gives them

    # --- KVEvents ---------------------------------------------------------------------------------

    def new_request(self, rec: BookRequest) -> LedgerRequest:
        embeds = None if rec.prompt_embeds is None else tuple(bytes.fromhex(r) for r in rec.prompt_embeds)
        mm = tuple(MMFeature(m.identifier, m.offset, m.length) for m in rec.mm_features)
        features = HashFeatures(
            lora=rec.lora,
            mm_features=tuple(sorted(mm, key=lambda m: m.offset)),
            cache_salt=rec.cache_salt,
            prompt_embeds=embeds,
        )
        r = LedgerRequest(rec, encoder=mm)
        r.ids = SequenceIdentities(self.trie, rec.request_id, features)
        return r

    def fresh(self, r: LedgerRequest, blocks: set[int]) -> None:
        for b in blocks:
            clear_block(self.ledger, BlockId(b))
        if self.world is not None:
            self.world.renewed(blocks)

    def released(self, candidates: Collection[int] | None) -> None:
        obs = self._obs()
        for b in get_written_blocks(self.ledger) if candidates is None else candidates:
            if (
                0 < b < obs.num_blocks
                and obs.ref_cnt[b] <= 0
                and obs.block_key[b] is None
                and b not in obs.secondary_keys
            ):
                clear_block(self.ledger, BlockId(b))
                if self.world is not None:
                    self.world.renewed((b,))

    def load(self, r: LedgerRequest, a: int, b: int, delayed: bool = False) -> None:
        """The connector writes ``[a, b)`` into the request's real blocks (it never reports nulls);
        with the world's facts (``harness.ledger.world``), only what it delivered."""
        if b <= a:
            return
        ids = r.identities(b)
        accesses = [x for x in self._accesses(r, range(a, b), ids, writes=True) if x.block]
        if self.world is not None:
            world = self.world
            accesses = [x for x in accesses if world.is_delivered(r.rid, x.block or 0, delayed)]
        self._write(r, accesses, None)

    def run(self, r: LedgerRequest, run: ModelRun) -> None:
        if run.arrival is not None:
            self.load(r, *run.arrival, delayed=True)
        ids = r.identities(run.end)
        self._write(r, self._accesses(r, range(run.start, run.end), ids, writes=True), run)
        self._write_encoder(r, run)
        self._check_promised(r, run)
        reads: list[SlotAccess] = []
        for g, spec in enumerate(self.config.groups):
            if spec.kind == "cross":
                reads += self._encoder_accesses(r, g, run.start)
            else:
                span = get_run_span(spec, run.start, run.end)
                reads += self._group_accesses(r, g, spec, span, ids, run)
        self._check("read", reads, r, run)
        for x in reads:
            if x.block:
                self.step_reads[(x.block, x.offset)] = (x, r)

    def appended(self, r: LedgerRequest, old_num_tokens: int) -> None:
        """Positions computed before their token was known now hold the real identity (§11.1)."""
        new, computed = r.rec.num_tokens, r.rec.num_computed_tokens
        if min(new, computed) <= old_num_tokens:
            return
        ids = r.identities(min(new, computed))
        for p in range(old_num_tokens, min(new, computed)):
            pending = self.trie.get_pending(r.rid, p)
            for x in self._accesses(r, range(p, p + 1), ids, writes=True):
                if x.block and x.held == pending:
                    write_slot(self.ledger, BlockId(x.block), x.offset, ids[p])

    def published(self, r: LedgerRequest, blocks: list[Publication], promised_end: int) -> None:
        """Covered slots past what this step still writes must hold their identities now; the
        others are due after the request's model run (§11.5)."""
        obs = self._obs()
        now = []
        for pub in blocks:
            lo = pub.index * self.config.groups[pub.group].block_size
            if pub.covered > max(lo, promised_end):
                now.append((pub, max(lo, promised_end)))
            if lo < promised_end:
                self.promised.setdefault(r.rid, []).append((pub, obs.block_key[pub.block]))
        self._check_publications(r, now, None)

    # --- accesses ---------------------------------------------------------------------------------

    def _obs(self) -> Observation:
        assert self.obs is not None, "the ledger saw an event before an observation"
        return self.obs

    def _accesses(
        self, r: LedgerRequest, positions: range, ids: Sequence[KVIdentity], writes: bool
    ) -> list[SlotAccess]:
        out: list[SlotAccess] = []
        for g, spec in enumerate(self.config.groups):
            if spec.kind != "cross":
                out += self._group_accesses(r, g, spec, positions, ids, None, writes)
        return out

    def _group_accesses(
        self,
        r: LedgerRequest,
        g: int,
        spec: AttentionSpec,
        positions: range,
        ids: Sequence[KVIdentity],
        run: ModelRun | None,
        writes: bool = False,
    ) -> list[SlotAccess]:
        obs = self._obs()
        rid, ledger, before = r.rid, self.ledger, self.before or obs
        table = obs.tables[g].get(rid, ())
        bs, size = spec.block_size, len(table)
        promised = {pub.block for pub, _ in self.promised.get(rid, ())}
        reader = None if run is None or writes else run.start  # the first reader: see LedgerChecker._finding
        out = []
        for p in positions:
            i, offset = divmod(p, bs)
            b = table[i] if i < size else None
            held = get_held(ledger, BlockId(b), offset) if b else None
            shared = bool(writes and b and b not in promised and self._is_shared(before, b, p))
            out.append(SlotAccess(rid, g, p, p if reader is None else reader, b, offset, ids[p], held, shared))
        return out

    @staticmethod
    def _is_shared(obs: Observation, b: int, p: int) -> bool:
        """Another live request may read the slot: the block is referenced twice, or its key covers ``p``."""
        if not 0 < b < obs.num_blocks:
            return False
        if obs.ref_cnt[b] > 1:
            return True
        if obs.block_key[b] is None:
            return False
        tokens = obs.block_key_tokens[b] if len(obs.block_key_tokens) == obs.num_blocks else None
        return tokens is None or p < tokens

    def _encoder_accesses(self, r: LedgerRequest, g: int, token: int) -> list[SlotAccess]:
        obs = self._obs()
        table, bs = obs.tables[g].get(r.rid, ()), self.config.groups[g].block_size
        out = []
        for e in range(r.encoder_len):
            item = next((m for m in r.encoder if m.offset <= e < m.offset + m.length), None)
            assert item is not None, f"{r.rid}: encoder position {e} is in no encoder input"
            b = table[e // bs] if e // bs < len(table) else None
            held = get_held(self.ledger, BlockId(b), e % bs) if b else None
            out.append(SlotAccess(r.rid, g, e, token, b, e % bs, self.trie.get_encoder(item, e, r.rid), held))
        return out

    def _write_encoder(self, r: LedgerRequest, run: ModelRun) -> None:
        """The first step after an allocation with encoder tokens writes the cross-attention KV."""
        al = r.alloc
        if al is None or al.enc == 0 or r.encoder_written is al:
            return
        r.encoder_len, r.encoder_written = al.enc, al
        for g, spec in enumerate(self.config.groups):
            if spec.kind == "cross":
                self._write(r, self._encoder_accesses(r, g, run.start), run)

    # --- checks -----------------------------------------------------------------------------------

    def _check(self, kind: AccessKind, accesses: list[SlotAccess], r: LedgerRequest, run: ModelRun | None) -> None:
        v = check_ledger(LedgerContext(kind, accesses, self._obs().num_blocks))
        if v is not None:
            raise LedgerBroken(v, kind, r, run)

    def _write(self, r: LedgerRequest, accesses: list[SlotAccess], run: ModelRun | None) -> None:
        self._check("write", accesses, r, run)
        for x in accesses:
            if not x.block:
                continue
            earlier = self.step_reads.get((x.block, x.offset))
            if earlier is not None and earlier[0].expected != x.expected:  # read earlier in this step
                read, reader = earlier
                bad = SlotAccess(
                    read.request_id,
                    read.group,
                    read.position,
                    read.token,
                    read.block,
                    read.offset,
                    read.expected,
                    x.expected,
                )
                self._check("read", [bad], reader, None)
            write_slot(self.ledger, BlockId(x.block), x.offset, x.expected)

    def _check_promised(self, r: LedgerRequest, run: ModelRun) -> None:
        """The publications of ``r``'s last allocation are due now, if the block is still there."""
        obs = self._obs()
        due = []
        for pub, key in self.promised.pop(r.rid, ()):
            table = obs.tables[pub.group].get(r.rid, ())
            if obs.block_key[pub.block] == key and pub.index < len(table) and table[pub.index] == pub.block:
                due.append((pub, pub.index * self.config.groups[pub.group].block_size))
        self._check_publications(r, due, run)

    def _check_publications(self, r: LedgerRequest, pubs: list[tuple[Publication, int]], run: ModelRun | None) -> None:
        """Each publication's covered slots from the given position on hold the request's identities."""
        if not pubs:
            return
        ids = r.identities(max(pub.covered for pub, _ in pubs))
        accesses = []
        for pub, lo in pubs:
            bs = self.config.groups[pub.group].block_size
            block = BlockId(pub.block)
            for p in range(lo, min((pub.index + 1) * bs, pub.covered)):
                held = get_held(self.ledger, block, p % bs)
                accesses.append(SlotAccess(r.rid, pub.group, p, p, pub.block, p % bs, ids[p], held))
        self._check("publish", accesses, r, run)


class LedgerChecker:
    """The ledger over one run of one target: ``start`` with the first observation, then ``check``
    after every operation (with the target's observation before and after it)."""

    def __init__(self, config: KVCacheConfig) -> None:
        self.config = config
        self.events = LedgerEvents(config)
        self.schedule: KVSchedule[LedgerRequest] = KVSchedule(self.events, config, publications=True)
        self.op_index = -1
        self.seconds = 0.0  # spent in check(), for the cost figures (harness/bench, tests/ledger/bench_ledger.py)

    def start(self, obs: Observation) -> None:
        self.events.obs = obs

    def check(self, op: O.Op, out: Any, before: Observation | None, obs: Observation) -> LedgerFinding | None:
        """Feed one applied operation; the first broken invariant as a finding, else None."""
        self.op_index += 1
        if not isinstance(op, STEP_OPS):
            self.events.step_reads.clear()  # the step ended
        self.events.obs, self.events.before = obs, before
        world = self.events.world
        if world is not None and isinstance(op, O.AllocateSlots) and op.delay_cache_blocks and out is not None:
            world.started(op.request_id)
        t = time.perf_counter()
        try:
            self.schedule.apply(op, out, before, obs)
        except LedgerBroken as e:
            return self._finding(e)
        finally:
            self.seconds += time.perf_counter() - t
        return None

    def world_facts(self) -> WorldFacts:
        """The world's load facts (``harness.ledger.world``), fed by a driver from now on."""
        if self.events.world is None:
            events = self.events

            def is_published(b: int) -> bool:
                obs = events.obs
                return obs is not None and 0 < b < obs.num_blocks and obs.block_key[b] is not None

            self.events.world = WorldFacts(events.ledger, is_published)
        return self.events.world

    def _finding(self, e: LedgerBroken) -> LedgerFinding:
        v, r, a = e.violation, e.request, e.violation.access
        spec = self.config.groups[a.group]
        window, chunk = group_sizes(spec)
        adm = r.admission
        source = "computed"
        if spec.kind == "cross":
            source = "encoder"
        elif adm is not None and adm.start <= a.position < adm.start + adm.hit:
            source = "prefix-hit"
        elif adm is not None and adm.start + adm.hit <= a.position < adm.start + adm.hit + adm.ext:
            source = "external-load"
        token = a.token
        if e.kind == "read" and e.run is not None and spec.kind != "cross":
            token = get_first_reader(spec, e.run.start, e.run.end, a.position)
        describe = self.events.trie.describe
        return LedgerFinding(
            v.name,
            v.rule,
            e.kind,
            a.request_id,
            a.group,
            spec.kind,
            spec.block_size,
            window,
            chunk,
            len(r.rec.prompt_token_ids),
            r.rec.num_tokens,
            token,
            a.position,
            a.block,
            a.offset,
            describe(a.expected),
            describe(a.held),
            source,
            e.run.recompute if e.run is not None else None,
            a.shared,
            self.op_index,
            self.events.trie.explain(a.expected, a.held),
            self.config.profile.release,
        )


class LedgerCheckTarget:
    """A ``Target`` that forwards every operation to ``inner`` and keeps the ledger alongside;
    ``apply`` raises ``LedgerMismatch`` at the first broken ledger invariant."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self.name = f"ledger({getattr(inner, 'name', type(inner).__name__)})"
        self.checker: LedgerChecker | None = None
        self.obs: Observation | None = None

    @property
    def version(self) -> str:
        return f"{self.inner.version} + kvspec KV ledger"

    def observe(self) -> Observation:
        return self.inner.observe()

    def reset(self, config: KVCacheConfig) -> None:
        self.inner.reset(config)
        self.checker = LedgerChecker(config)
        self.obs = self.inner.observe()
        self.checker.start(self.obs)

    def apply(self, op: O.Op) -> Any:
        assert self.checker is not None and self.obs is not None, "LedgerCheckTarget.apply called before reset(config)"
        out = self.inner.apply(op)
        before = self.obs
        if O.changes_observation(op):
            self.obs = self.inner.observe()
        finding = self.checker.check(op, out, before, self.obs)
        if finding is not None:
            raise LedgerMismatch(finding)
        return out
