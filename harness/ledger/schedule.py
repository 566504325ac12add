"""The one mapping from ``harness.core.ops`` to what the model runner does with KV, shared by the
KV-content oracle (``harness.oracle.target``, numbers) and the KV ledger (``harness.ledger.checker``, identities).

``KVSchedule.apply(op, outcome, before, obs)`` turns each operation into events for a consumer
(``KVEvents``), with the target's tables as observed after it (vLLM 0.33 ``GPUModelRunner`` /
``Scheduler`` semantics, docs/semantics.md §11.2):

- ``SetNumComputedTokens(rid, n)`` with ``n`` above the previous count ``p``: positions ``[p, n)``
  became computed.  The last successful ``AllocateSlots`` of the request (made at computed count
  ``c``, with ``h = num_new_computed_tokens`` and ``e = num_external_computed_tokens``) says which
  of them are prefix-cache hits (``[c, c+h)``: to verify before the next model run, as a hit may
  point at blocks another request computes earlier in the same engine step), which a KV connector
  loads (``[c+h, c+h+e)``: ``load`` at once for a synchronous load; for ``delay_cache_blocks``, at
  the request's ``CacheBlocks`` (the arrival) or at the latest before its next model run) and which
  the model computes (the rest: one ``run``, drafts included past ``num_tokens``).
- A decrease (spec-decode rejection, preemption, a failed load) drops what is pending beyond it;
  one that cuts into a connector load marks the positions up to the old count as a recompute:
  ``full-remote-load`` (the last prompt token after a whole-prompt async load) or ``load-recovery``
  (a failed load or invalid blocks).
- ``fresh``: blocks an ``AllocateSlots`` adds to a table that are not the request's prefix hits;
  ``released``: after a call that can drop references (the candidates, or None for every block),
  blocks with no reference and no key hold nothing any more.
- ``published`` (when asked for): blocks of the request that gained a key in this call, with the
  end of the positions its step still promises to write (docs/semantics.md §11.5).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest, RequestBook
from kvspec.harness.core.observation import Observation
from kvspec.harness.ledger.request import Alloc, ScheduledRequest
from kvspec.spec.config import KVCacheConfig

R = TypeVar("R", bound=ScheduledRequest)
FULL_REMOTE_LOAD = "full-remote-load"
LOAD_RECOVERY = "load-recovery"


@dataclass(frozen=True)
class ModelRun:
    """The model computes positions ``[start, end)`` of one request in this step."""

    start: int
    end: int
    hits: list[tuple[int, int]]  # prefix-hit ranges adopted since the last run (verify first)
    arrival: tuple[int, int] | None  # an async connector load that lands before the run
    recompute: str | None  # FULL_REMOTE_LOAD / LOAD_RECOVERY: why the run repeats positions


@dataclass(frozen=True)
class Publication:
    """Block ``block`` at index ``index`` of the request's table in ``group`` gained a key covering
    positions up to ``covered`` (a partial tail entry covers less than the block)."""

    group: int
    index: int
    block: int
    covered: int


class KVEvents(Protocol[R]):
    """What a consumer of the mapping does with each event."""

    def new_request(self, rec: BookRequest) -> R: ...

    def fresh(self, r: R, blocks: set[int]) -> None: ...

    def released(self, candidates: Collection[int] | None) -> None: ...

    def load(self, r: R, a: int, b: int, delayed: bool = False) -> None: ...

    def run(self, r: R, run: ModelRun) -> None: ...

    def appended(self, r: R, old_num_tokens: int) -> None: ...

    def published(self, r: R, blocks: list[Publication], promised_end: int) -> None: ...


class KVSchedule(Generic[R]):
    """The op -> KV-event mapping for one run; keeps the requests in a ``RequestBook``."""

    def __init__(self, events: KVEvents[R], config: KVCacheConfig, *, publications: bool = False) -> None:
        self.events = events
        self.config = config
        self.publications = publications
        self.book: RequestBook[R] = RequestBook()
        self.obs: Observation | None = None

    def apply(self, op: O.Op, out: Any, before: Observation | None, obs: Observation | None) -> None:
        """Map one applied operation (``out`` its outcome, ``before`` / ``obs`` the target's state
        before and after it) onto the consumer's events."""
        self.obs = obs
        if isinstance(op, O.REQUEST_OPS):
            self._request_op(op)
        elif isinstance(op, O.EvictBlocks):
            self.events.released(op.block_ids)
        elif isinstance(op, O.ResetPrefixCache):
            self.events.released(None)
        elif isinstance(op, O.TakeEvents) or op.request_id not in self.book:
            return  # no KV change, or the target accepted an unknown request: nothing to model
        elif isinstance(op, O.GetComputedBlocks):
            r = self.book.get_native(op.request_id)
            r.lookup = [list(g) for g in out["block_ids"]] if isinstance(out, dict) else None
        elif isinstance(op, O.AllocateSlots):
            self._allocated(self.book.get_native(op.request_id), op, out, before)
        elif isinstance(op, O.Free):
            self._freed(self.book.get_native(op.request_id), before)
        elif isinstance(op, O.CacheBlocks):
            r = self.book.get_native(op.request_id)
            self._arrive(r, op.num_computed_tokens)
            self._publish(r, before, 0)
        elif isinstance(op, O.RemoveSkippedBlocks):
            self.events.released(_held_blocks(before, op.request_id))

    # --- scheduler-side changes of a request ---------------------------------------------------------

    def _request_op(self, op: O.Op) -> None:
        """``RequestBook.apply``, then what the change means for KV."""
        if isinstance(op, O.AddRequest):
            self.book.requests.pop(op.request_id, None)  # added again (the target took it): start afresh
            self.book.native[op.request_id] = self.events.new_request(self.book.apply(op))
            return
        rid: str = getattr(op, "request_id", "")
        if rid not in self.book:  # the target accepted an unknown request: nothing to model
            return
        r = self.book.get_native(rid)
        drafts, computed, num_tokens = r.rec.spec_token_ids, r.rec.num_computed_tokens, r.rec.num_tokens
        self.book.apply(op)
        if isinstance(op, O.AppendOutputTokens):
            r.sched_drafts = ()
            self.events.appended(r, num_tokens)
        elif isinstance(op, O.SetSpecTokens):
            if not op.token_ids and drafts:  # scheduled: cleared, but computed in this step
                r.sched_drafts = drafts
        elif isinstance(op, O.SetNumComputedTokens):
            self._computed(r, computed, op.num_computed_tokens)

    def _computed(self, r: R, prev: int, n: int) -> None:
        """The computed count moved from ``prev`` to ``n``: positions ``[prev, n)`` are prefix hits,
        connector loads or model runs, as the last allocation said."""
        if n < prev:  # rejection, preemption, failed load: positions >= n are recomputed later
            r.pending_hit = [(a, min(b, n)) for a, b in r.pending_hit if a < n]
            if r.pending_ext is not None:
                a, b = r.pending_ext
                r.pending_ext = (a, min(b, n)) if a < n else None
            r.recompute = _recompute_reason(r, prev, n) or r.recompute
            r.alloc = None
            return
        if n == prev:
            return
        model_start = prev
        al = r.alloc
        if al is not None:
            hit_end = al.start + al.hit
            ext_end = hit_end + al.ext
            hs, he = max(prev, al.start), min(n, hit_end)
            if he > hs:
                r.pending_hit.append((hs, he))
            es, ee = max(prev, hit_end), min(n, ext_end)
            if ee > es:
                if al.delay:
                    lo = es if r.pending_ext is None else min(es, r.pending_ext[0])
                    hi = ee if r.pending_ext is None else max(ee, r.pending_ext[1])
                    r.pending_ext = (lo, hi)
                else:
                    self.events.load(r, es, ee)
            if al.delay and hit_end <= n < ext_end:
                # A delayed load that ends short of its end in one move (vLLM's real scheduler sets the
                # count once, after the load): what a rise to the end then a fall would say.
                r.recompute = _recompute_reason(r, ext_end, n) or r.recompute
            model_start = max(prev, ext_end)
        if n > model_start:
            self._run(r, model_start, n)

    def _run(self, r: R, start: int, end: int) -> None:
        hits, r.pending_hit = r.pending_hit, []
        arrival = None
        if r.pending_ext is not None:  # the load must have arrived before the request runs again
            a, b = r.pending_ext
            r.pending_ext = None
            arrival = (a, min(b, end))
        recompute = None
        if r.recompute is not None:
            recompute = r.recompute[0] if start < r.recompute[1] else None
            if end >= r.recompute[1]:
                r.recompute = None
        self.events.run(r, ModelRun(start, end, hits, arrival, recompute))

    # --- manager calls ------------------------------------------------------------------------------

    def _allocated(self, r: R, op: O.AllocateSlots, out: Any, before: Observation | None) -> None:
        """Fresh blocks (not the request's prefix hits), the allocation's layout, publications; then
        the blocks ``allocate_slots`` released first (out-of-window)."""
        if out is not None:
            assert self.obs is not None
            hits = r.lookup if (op.use_computed_blocks and r.lookup is not None) else []
            fresh = get_fresh_blocks(before, self.obs, r.rid, hits, out)
            self.events.fresh(r, fresh)
            r.alloc = Alloc(
                r.rec.num_computed_tokens,
                op.num_new_computed_tokens,
                op.num_external_computed_tokens,
                op.delay_cache_blocks,
                op.num_new_tokens,
                op.num_encoder_tokens,
            )
            if op.num_new_computed_tokens or op.num_external_computed_tokens or op.num_encoder_tokens:
                r.admission = r.alloc
            if op.use_computed_blocks:
                r.lookup = None
            al = r.alloc
            self._publish(r, before, al.start + al.hit + (0 if al.delay else al.ext + al.new))
        self.events.released(_held_blocks(before, r.rid))

    def _freed(self, r: R, before: Observation | None) -> None:
        r.alloc, r.admission, r.pending_hit, r.pending_ext, r.lookup, r.recompute = None, None, [], None, None, None
        self.events.released(_held_blocks(before, r.rid))

    def _arrive(self, r: R, upto: int) -> None:
        """``cache_blocks`` after an async load: the connector has written ``[a, min(b, upto))``."""
        if r.pending_ext is None:
            return
        a, b = r.pending_ext
        end = min(b, upto)
        if end > a:
            self.events.load(r, a, end, delayed=True)
        r.pending_ext = (end, b) if end < b else None

    def _publish(self, r: R, before: Observation | None, promised_end: int) -> None:
        if self.publications and self.obs is not None:
            blocks = get_publications(before, self.obs, r.rid, self.config)
            if blocks:
                self.events.published(r, blocks, promised_end)


def get_publications(
    before: Observation | None, obs: Observation, rid: str, config: KVCacheConfig
) -> list[Publication]:
    """Blocks of ``rid``'s tables whose primary key appeared or changed between ``before`` and ``obs``,
    with the positions the key covers (``block_key_tokens`` when the target reports it; else the
    whole block, capped at the request's hashed tokens)."""
    out: list[Publication] = []
    hashed = len(obs.request_block_hashes.get(rid, ())) * config.hash_block_size
    key_tokens = obs.block_key_tokens if len(obs.block_key_tokens) == obs.num_blocks else None
    for g, tables in enumerate(obs.tables):
        bs = config.groups[g].block_size
        for i, b in enumerate(tables.get(rid, ())):
            if not 0 < b < obs.num_blocks or obs.block_key[b] is None:
                continue
            if before is not None and b < before.num_blocks and before.block_key[b] == obs.block_key[b]:
                continue
            covered = key_tokens[b] if key_tokens is not None else None
            out.append(Publication(g, i, b, covered if covered is not None else min((i + 1) * bs, hashed)))
    return out


def get_fresh_blocks(
    before: Observation | None, obs: Observation, rid: str, hits: list[list[int]], out: Any
) -> set[int]:
    """The blocks an allocation handed out fresh: in ``rid``'s new tables, neither kept at their index
    from before nor adopted at their index from the lookup ``hits`` (a hit the window passed is left
    untouched and may come back fresh elsewhere, docs/semantics.md §3.4) nor a cached block adopted
    under the key it had before (SGLang repoints a row to the tree's copy of a prefix at its
    checkpoint: the copy keeps its KV, which the next read checks), and every new block the outcome
    names."""
    fresh: set[int] = set()
    for g, tables in enumerate(obs.tables):
        old = before.tables[g].get(rid, ()) if before is not None else ()
        hit = hits[g] if g < len(hits) else []
        adopted = set()
        for i, b in enumerate(tables.get(rid, ())):
            if (i < len(hit) and hit[i] == b) or _keeps_key(before, obs, b):
                adopted.add(b)
            elif b != 0 and not (i < len(old) and old[i] == b):
                fresh.add(b)
        if isinstance(out, dict) and g < len(out.get("block_ids", ())):
            fresh.update(b for b in out["block_ids"][g] if b != 0 and b not in adopted)
    return fresh


def _keeps_key(before: Observation | None, obs: Observation, b: int) -> bool:
    """Block ``b`` carried a key before the call and carries the same one after it (a cached copy)."""
    if before is None or not 0 < b < min(before.num_blocks, obs.num_blocks):
        return False
    key = before.block_key[b]
    return key is not None and obs.block_key[b] == key


def _held_blocks(obs: Observation | None, rid: str) -> list[int]:
    """Every real block of ``rid``'s tables in ``obs`` (the candidates a call on ``rid`` may release)."""
    if obs is None:
        return []
    return [b for tables in obs.tables for b in tables.get(rid, ()) if b]


def _recompute_reason(r: ScheduledRequest, prev: int, n: int) -> tuple[str, int] | None:
    """A decrease that cuts into the last allocation's connector load: the whole-prompt async load
    whose last token is recomputed (vLLM 0.33 ``_update_waiting_for_remote_kv``), or a recovery from
    a failed load or invalid blocks (``_update_requests_with_invalid_blocks``)."""
    al = r.alloc
    if al is None or al.ext == 0 or n >= al.start + al.hit + al.ext:
        return None
    ext_end = al.start + al.hit + al.ext
    if al.delay and prev == ext_end == r.rec.num_tokens and n == prev - 1:
        return (FULL_REMOTE_LOAD, prev)
    return (LOAD_RECOVERY, prev)
