"""The ``sglang`` target: SGLang's radix cache driven through kvspec's operations, as its scheduler drives it.

kvspec's world is a scheduler's stream of operations (``harness.core.ops``); this adapter turns each
into what SGLang 0.5.23's scheduler does at the same point, calling SGLang's own functions:

- ``get_computed_blocks``: ``Req.init_next_round_input`` (a waiting request's match,
  ``common.match_kv_cache``, capped at ``len - 1`` and at a logprob start);
- the first ``allocate_slots`` of a request: admission (``UnifiedRadixCache.lock`` on the matched
  node, a budget test: the pages fit in available plus evictable tokens), then ``alloc_for_extend``'s
  steps (``alloc_req_slots``, ``alloc_token_slots`` or ``alloc_paged_token_slots_extend``, which
  evict from the tree first, and the row written); later ones extend the row (a chunk, or
  ``alloc_paged_token_slots_decode`` for a decode token);
- with a sliding window, each later ``allocate_slots`` first runs ``ScheduleBatch.maybe_evict_swa``
  for the request (``evict_sliding_windows``: the window's slots behind the query go back), as
  ``alloc_for_decode`` and ``alloc_for_extend`` do;
- a model run that ends an extend (``set_num_computed_tokens``): ``checkpoint_kv_cache`` (SGLang
  inserts each chunk and the whole prompt into the tree, dedups against what the tree holds and
  repoints the row; with a sliding window it also drops the window's pages behind it);
- ``free``: ``release_kv_cache(checkpoint=True)`` for a finished or aborted request (insert, free the
  rest, unlock), ``release_req`` for a preempted one (SGLang's retract: no insert, evict, reset);
- ``reset_prefix_cache``: the scheduler's ``flush_cache`` (only when idle).

One place differs from SGLang's loop, and it is named: SGLang allocates and computes in one
iteration, kvspec's world may free a request between its allocation and its model run (an abort);
``free`` then first gives back the slots that were never computed, as SGLang's in-flight abort does.

The observation (``harness.sglang.observe``) reports the tree and rows in kvspec's terms.  The
target's engine is ``sglang``: the engine-neutral invariants, SGLang's policy (``spec.invariants``
§12) and the KV ledger apply, vLLM's policy does not; its relation is ``invariants``.

Imports: harness.core, harness.targets, harness.sglang, spec.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.observation import Observation
from kvspec.harness.sglang.build import SglangCache, build_cache
from kvspec.harness.sglang.load import load_sglang
from kvspec.harness.sglang.observe import get_pad_value, get_pool_sizes, observe_cache, window_table
from kvspec.harness.targets.adapter import BlockIds, ManagerAdapter
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.spec import make_spec_request
from kvspec.spec.config import KVCacheConfig
from kvspec.spec.events import Event
from kvspec.spec.request import Request, RequestStatus, append_output_token_ids

RETRACT_DECODE_STEPS = 20
"""SGLang 0.5.23 ``SGLANG_RETRACT_DECODE_STEPS``: tokens per remaining request evicted after a retract."""
SGLANG_LIMITS = {"connector": False, "num_spec_tokens": 0, "num_lookahead_tokens": 0}
"""The scheduler features SGLang's cache is not driven with (``sched_limits``): vLLM's KV connector
(SGLang disaggregates differently) and drafts (its speculative decoding allocates on its own path)."""

SWA_EVICTION_INTERVAL = 1
"""``SGLANG_SWA_EVICTION_INTERVAL``: a decoding request's window slides once this many tokens have
left it.  SGLang's default is 128, which kvspec's short requests never reach; 1 (a legal setting)
slides the window at every step, the tightest it runs."""
DECLINED = {
    "sliding_window": "a model of sliding-window layers only gets SGLang's PureSWARadixCache, not driven "
    "(hybrid_equal drives full attention + a sliding window)",
    "chunked_local": "SGLang has no chunked-local attention pool",
    "hybrid_diff": "SGLang's hybrid pools share one page size",
    "hybrid_two_full": "two full-attention groups are vLLM's hybrid manager",
    "events": "SGLang publishes its own KV events, not vLLM's",
    "encoder_decoder": "SGLang's cross-attention cache is not driven",
    "async_sched": "SGLang's overlap scheduler is not driven",
    "prompt_embeds": "prompt embeddings reach SGLang's cache as input embeddings: not driven",
    "hash_block_override": "SGLang keys its tree by page; a separate hash block size is vLLM's",
}
"""The families the ``sglang`` target declines, each with why."""


@dataclass
class SglRequest:
    """One request: SGLang's ``Req``, kvspec's hash chain of its tokens, and where it stands."""

    req: Any
    hashes: Request
    admitted: bool = False  # holds a row (and a lock on its prefix)
    fill_len: int = 0  # tokens its extend covers: prompt + outputs at admission
    status: str = RequestStatus.WAITING.value
    checkpointed: int = 0  # tokens its last checkpoint covered (a new one only past it)
    released: bool = False  # freed, and not yet told why (a preemption's SetStatus may follow)


def get_input_ids(r: BookRequest) -> list[int]:
    """The prompt as SGLang's tree sees it: a multimodal item's placeholder tokens replaced by its
    pad value (SGLang's ``pad_input_ids``: the item's identity in the token ids), here one per item
    identifier and placeholder token (``get_pad_value``)."""
    tokens = list(r.prompt_token_ids)
    for m in r.mm_features:
        for p in range(m.offset, m.offset + m.length):
            tokens[p] = get_pad_value(m.identifier, tokens[p], m.length)
    return tokens


def get_extra_key(lora: tuple[str, str] | None) -> str | None:
    """SGLang's namespace for a LoRA adapter: name and path (two adapters may share a name)."""
    return None if lora is None else f"lora:{lora[0]}:{lora[1]}"


class SglangTarget(ManagerAdapter[SglRequest]):
    name = "sglang"
    engine = "sglang"
    relation = "invariants"
    relation_reason = "SGLang's radix cache is another engine: its block ids and policy legitimately differ from vLLM's"
    sched_limits = SGLANG_LIMITS
    declined_families = DECLINED

    def __init__(self) -> None:
        super().__init__()
        self.cache: SglangCache | None = None
        self.due: list[Callable[[], None]] = []  # SGLang's steps that wait for the next scheduling call

    def apply(self, op: O.Op) -> Any:
        """One operation; first what SGLang does at the start of its next scheduling round or in its
        output processing (``due``), before anything an observation could show."""
        if self.due and O.changes_observation(op):
            due, self.due = self.due, []
            for step in due:
                step()
        return super().apply(op)

    @property
    def version(self) -> str:
        return f"sglang {load_sglang()['version']} (UnifiedRadixCache, Python tree core)"

    # --- building ------------------------------------------------------------------------------

    def build(self, config: KVCacheConfig) -> None:
        self.cache = build_cache(config)
        self.due = []

    def _c(self) -> SglangCache:
        assert self.cache is not None, "reset(config) first"
        return self.cache

    def new_request(self, r: BookRequest) -> SglRequest:
        if r.prompt_embeds is not None:
            raise Unsupported("prompt embeddings reach SGLang as input embeddings, which its cache is not keyed by")
        c = self._c()
        sp = c.sg["SamplingParams"](max_new_tokens=c.config.max_model_len, ignore_eos=True)
        sp.normalize(None)
        req = c.sg["Req"](r.request_id, "", array("q", get_input_ids(r)), sp)
        req.extra_key = get_extra_key(r.lora)
        req.cache_salt = r.cache_salt or None
        if r.skip_reading_prefix_cache or r.prompt_logprob_start is not None:
            req.return_logprob = True  # SGLang caps the match at the first scored row
            req.logprob_start_len = 0 if r.skip_reading_prefix_cache else r.prompt_logprob_start
        return SglRequest(req, make_spec_request(r, c.config))  # kvspec's hashes of its tokens

    def update_request(self, native: SglRequest, r: BookRequest, op: O.Op) -> SglRequest:
        if isinstance(op, O.AppendOutputTokens):
            native.req.output_ids.extend(op.token_ids)
            native.hashes = append_output_token_ids(native.hashes, op.token_ids)
        elif isinstance(op, O.SetStatus):
            native.status = op.status
            if op.status == RequestStatus.PREEMPTED.value and native.released:
                native.released = False
                self.due.append(lambda: self._retract(native))
        elif isinstance(op, O.SetNumComputedTokens):
            self._after_model_run(native, op.num_computed_tokens)
        elif isinstance(op, O.SetSpecTokens) and op.token_ids:
            raise Unsupported("drafts: SGLang's speculative decoding is not driven")
        elif isinstance(op, O.SetNumInFlightTokens) and op.num_in_flight_tokens:
            raise Unsupported("tokens in flight: SGLang's overlap scheduler is not driven")
        return native

    # --- the manager calls ---------------------------------------------------------------------

    def get_computed_blocks(self, native: SglRequest) -> tuple[Any, BlockIds, int]:
        """A waiting request's match (SGLang: each scheduling round matches it anew)."""
        assert not native.admitted, f"{native.req.rid} already holds a row"
        c = self._c()
        native.req.init_next_round_input(c.tree)
        return None, self._prefix_pages(native), native.req.prefix_len

    def allocate_slots(self, native: SglRequest, op: O.AllocateSlots, new_computed_blocks: Any) -> BlockIds | None:
        if op.num_lookahead_tokens or op.num_external_computed_tokens or op.delay_cache_blocks or op.num_encoder_tokens:
            raise Unsupported("lookahead, external or encoder tokens: vLLM features SGLang's cache is not driven with")
        if not native.admitted:
            return self._admit(native, op)
        return self._extend(native, self.book.get(native.req.rid).num_computed_tokens + op.num_new_tokens)

    def free(self, native: SglRequest, request_id: str) -> None:
        """SGLang's release of a finished request (``release_kv_cache(checkpoint=True)``: insert what
        it computed, free the rest, unlock).  The world frees a preempted request before it says so
        (``SetStatus(PREEMPTED)`` follows): its release is this one, then ``_retract``."""
        if not native.admitted:
            return  # a waiting request holds nothing (SGLang pops it from the queue)
        c, req = self._c(), native.req
        self._drop_uncomputed(native, self.book.get(request_id).num_computed_tokens)
        req.finished_reason = c.sg["FINISH_LENGTH"](len(req.output_ids))
        c.sg["release_kv_cache"](req, c.tree, checkpoint=True)
        native.admitted = False
        native.released = True

    def _retract(self, native: SglRequest) -> None:
        """The rest of SGLang's retract (``release_req``): the tree evicted for the others' next
        decode steps, the request reset to be matched anew."""
        c, req = self._c(), native.req
        req.finished_reason = None
        others = sum(n.admitted for n in self.book.native.values())
        c.sg["evict_from_tree_cache"](c.tree, others * RETRACT_DECODE_STEPS)
        req.reset_for_retract()

    def cache_blocks(self, native: SglRequest, num_computed_tokens: int) -> None:
        raise Unsupported("an explicit cache_blocks (P/D arrival, early caching) is vLLM's; SGLang checkpoints")

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        return None  # full attention skips nothing

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        raise Unsupported("evict_blocks answers a failed KV load of vLLM's connector")

    def reset_prefix_cache(self) -> bool:
        """The scheduler's ``flush_cache``: only when no request holds a row."""
        c = self._c()
        if any(n.admitted for n in self.book.native.values()):
            return False
        c.tree.reset()
        c.rows.clear()
        c.allocator.clear()
        return True

    def take_events(self) -> list[Event]:
        return []

    def observe(self) -> Observation:
        # where each request's next model run starts: its computed tokens, or its matched prefix
        computed = {
            rid: max(self.book.get(rid).num_computed_tokens, x.req.kv.cache_protected_len if x.admitted else 0)
            for rid, x in self.book.native.items()
        }
        return observe_cache(self._c(), self.book.native, computed)

    # --- SGLang's scheduler steps ----------------------------------------------------------------

    def _prefix_pages(self, native: SglRequest) -> BlockIds:
        """The pages of the request's matched prefix, per group."""
        c, req = self._c(), native.req
        slots = c.tree.prefix_device_indices(req)[: req.prefix_len].tolist() if req.prefix_len else []
        return self._group_pages(slots)

    def _group_pages(self, slots: list[int]) -> BlockIds:
        """The pages of a run of row slots starting on a page, per kvspec group (a sliding window's:
        the pages they map to, ``harness.sglang.observe.window_table``)."""
        c = self._c()
        out: BlockIds = [[] for _ in c.config.groups]
        out[c.full_group] = [s // c.page_size for s in slots[:: c.page_size]]
        if c.swa_group is not None:
            out[c.swa_group] = list(window_table(c, slots))
        return out

    def _admit(self, native: SglRequest, op: O.AllocateSlots) -> BlockIds | None:
        """``PrefillAdder.add_one_req`` then ``alloc_for_extend`` for one request."""
        c, req = self._c(), native.req
        hit = op.num_new_computed_tokens if op.use_computed_blocks else 0
        req.init_next_round_input(c.tree)  # the round's own match (nothing ran since the lookup)
        if req.prefix_len != hit:
            assert hit < req.prefix_len, f"{req.rid}: {hit} computed tokens, SGLang matched {req.prefix_len}"
            c.sg["match_kv_cache"](req, c.tree, max_prefix_len=hit)
            req.kv.cache_protected_len = req.prefix_len
        seq = hit + op.num_new_tokens
        req.lock = c.tree.lock(req.last_node)
        if not self._fits(hit, seq):
            c.tree.unlock(req.lock)
            req.lock = None
            return None
        req.extend_end = seq
        c.sg["alloc_req_slots"](c.rows, [req], c.tree)
        prefix = c.tree.prefix_device_indices(req)[:hit] if hit else None
        out = self._alloc_extend(prefix, hit, seq)
        row = req.kv.req_pool_idx
        if hit:
            c.rows.write((row, slice(0, hit)), prefix)
        c.rows.write((row, slice(hit, seq)), out)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = seq
        native.admitted, native.fill_len = True, len(req.origin_input_ids) + len(req.output_ids)
        native.checkpointed = hit
        return self._row_pages(native, hit, seq)

    def _extend(self, native: SglRequest, seq: int) -> BlockIds | None:
        """A running request's next chunk or decode token: its row grown to ``seq`` slots."""
        c, req = self._c(), native.req
        have = req.kv.kv_allocated_len
        decoding = have >= native.fill_len and seq - have == 1
        if c.swa_group is not None:
            self._maybe_evict_swa(native, decoding)
        if seq <= have:
            return [[] for _ in c.config.groups]
        if not self._fits(have, seq):
            return None
        row = req.kv.req_pool_idx
        last = c.rows.req_to_token[row, have - 1 : have].to(c.sg["torch"].int64) if have else None
        out = self._alloc_decode(last, seq) if decoding else self._alloc_extend(last, have, seq)
        if decoding:
            req.decode_batch_idx += 1
        c.rows.write((row, slice(have, seq)), out)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = seq
        req.extend_end = seq
        return self._row_pages(native, have, seq)

    def _maybe_evict_swa(self, native: SglRequest, decoding: bool) -> None:
        """``ScheduleBatch.maybe_evict_swa`` for one request, before its allocation: a decoding
        request (past its first decode step) slides its window once ``SWA_EVICTION_INTERVAL`` tokens
        have left it; a chunk does only without prefix sharing (a shared cache's checkpoint drops them)."""
        c, req = self._c(), native.req
        computed = self.book.get(req.rid).num_computed_tokens
        component = c.sg["ComponentType"].SWA
        if decoding:
            due = computed - c.window >= req.kv.get_evicted_seqlen(component) + SWA_EVICTION_INTERVAL
            if req.decode_batch_idx >= 1 and req.kv.holds_kv and due:
                c.tree.evict_sliding_windows(req, computed, eviction_interval=1)
        elif not c.tree.supports_prefix_sharing():
            c.tree.evict_sliding_windows(req, computed)

    def _fits(self, have: int, seq: int) -> bool:
        """The pages to add fit in available plus evictable tokens.  Simpler than SGLang's
        ``PrefillAdder``, which also holds back room for the running requests' future decode tokens
        (``new_token_ratio``): this target admits more than SGLang would, and kvspec's world then
        preempts more (docs/sglang.md).  A hybrid takes a page of each pool per page of the row."""
        c = self._c()
        p = c.page_size
        need = (-(-seq // p) - (-(-have // p))) * p
        return all(need <= s["available"] + s["evictable"] for s in get_pool_sizes(c).values())

    def _alloc_extend(self, last: Any, have: int, seq: int) -> Any:
        c = self._c()
        if c.page_size == 1:
            return c.sg["alloc_token_slots"](c.tree, seq - have)
        torch = c.sg["torch"]
        last_loc = last[-1:] if last is not None and len(last) else torch.full((1,), -1, dtype=torch.int64)
        pre, end = torch.tensor([have]), torch.tensor([seq])
        return c.sg["alloc_paged_token_slots_extend"](
            tree_cache=c.tree,
            prefix_lens=pre,
            prefix_lens_cpu=pre,
            seq_lens=end,
            seq_lens_cpu=end,
            last_loc=last_loc,
            extend_num_tokens=seq - have,
        )

    def _alloc_decode(self, last: Any, seq: int) -> Any:
        c = self._c()
        if c.page_size == 1:
            return c.sg["alloc_token_slots"](c.tree, 1)
        end = c.sg["torch"].tensor([seq])
        return c.sg["alloc_paged_token_slots_decode"](c.tree, end, end, last_loc=last)

    def _row_pages(self, native: SglRequest, start: int, end: int) -> BlockIds:
        """The pages the row gained for positions ``[start, end)`` (a page already there is not new), per group."""
        c = self._c()
        p, row = c.page_size, native.req.kv.req_pool_idx
        first = -(-start // p)
        return self._group_pages(c.rows.req_to_token[row, first * p : end].tolist())

    def _after_model_run(self, native: SglRequest, computed: int) -> None:
        """An extend's model run ends with SGLang's checkpoint: a chunk's at the next scheduling round
        (``stash_chunked_request``), the prompt's end in the output processing that appends its first
        token (``process_batch_result_prefill``); both before the next call that shows (``due``).  A
        decode inserts nothing."""
        req = native.req
        if not native.admitted or computed > req.kv.kv_allocated_len:
            return
        if native.checkpointed < computed <= native.fill_len:
            native.checkpointed = computed
            self.due.append(lambda: self._checkpoint(native, computed))

    def _checkpoint(self, native: SglRequest, computed: int) -> None:
        """``checkpoint_kv_cache`` at ``computed`` tokens, if the request still holds its row."""
        c, req = self._c(), native.req
        if native.admitted and req.kv.kv_committed_len >= computed:
            req.extend_end = computed
            c.sg["checkpoint_kv_cache"](req, c.tree)

    def _drop_uncomputed(self, native: SglRequest, computed: int) -> None:
        """The slots allocated past what was computed go back first (SGLang's in-flight abort)."""
        c, kv = self._c(), native.req.kv
        start = max(-(-computed // c.page_size) * c.page_size, kv.cache_protected_len)
        if kv.kv_allocated_len > computed:
            if start < kv.kv_allocated_len:
                c.tree.free_kv_row(kv, [(start, kv.kv_allocated_len)])
            kv.kv_allocated_len = kv.kv_committed_len = max(computed, kv.cache_protected_len)
