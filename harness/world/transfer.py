"""The KV-transfer side of kvspec's scheduler model (``harness.world.scheduler``): a KV connector's answers
(``get_num_new_matched_tokens``), asynchronous loads that arrive, fail or are aborted meanwhile,
synchronous loads that report invalid blocks, and the blocks an asynchronous load's admission sets
aside for in-flight prefills (vLLM 0.33 ``Scheduler``: ``_update_waiting_for_remote_kv``,
``_handle_invalid_blocks``, ``_inflight_prefill_reserved_blocks``).

``KVTransfers`` is split from the scheduler along vLLM's own seam and held by it
(``Scheduler.transfers``).  It is given what it needs: the knobs, ``emit``, the record changes
(``harness.world.records.RequestChanges``), the scheduler's counters and the block-table reader
when built; the requests it looks at, the running ones and the world's choices with each call.
It keeps its own state only: the requests aborted while loading, and ``load_reservation``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.world.choices import Choices
from kvspec.harness.world.records import RequestChanges, SchedConfig, SReq
from kvspec.spec.request import RequestStatus


class KVTransfers:
    """The connector side of the scheduler model (see the module docstring)."""

    def __init__(
        self,
        cfg: SchedConfig,
        emit: Callable[[O.Op], Any],
        changes: RequestChanges,
        counts: Counter[str],
        table: Callable[[str], tuple[int, ...]] | None,
    ) -> None:
        self.cfg = cfg
        self.emit = emit
        self.changes = changes
        self.counts = counts
        self.table = table  # group-0 block table of a request (for invalid-block recovery)
        self.loading_aborted: dict[str, SReq] = {}  # aborted while loading: freed when the load reports
        # An asynchronous load is admitted only with the remaining blocks of the in-flight prefills
        # set aside; ``load_reservation(pending, step_tokens)`` (``SpecTarget.load_reservation`` on
        # the reference state) counts them.  Unset, nothing is set aside (a driver without a
        # reference state).
        self.load_reservation: Callable[[list[tuple[str, int, int]], int], int] | None = None

    # --- asynchronous loads --------------------------------------------------------------------

    def arrived_after_abort(self, rid: str) -> bool:
        """The load of a request aborted meanwhile reports: its blocks are freed now (True), else
        nothing happens here (False)."""
        if rid not in self.loading_aborted:
            return False
        r = self.loading_aborted.pop(rid)
        self.emit(O.Free(r.request_id))
        self.counts["free_after_load"] += 1
        return True

    def load_finished(self, r: SReq, ok: bool, valid_tokens: int) -> None:
        """The worker reports ``finished_recving`` (or a failed load, ``valid_tokens`` of it valid)
        for ``r``'s asynchronous load."""
        assert r.recv == "pending"
        if ok and not r.load_poisoned:
            r.recv = "done"
            self.counts["load_ok"] += 1
        else:  # a poisoned load was truncated already (``_handle_invalid_blocks``): never lengthened
            r.recv = "failed"
            r.load_poisoned = False
            if not ok:
                self.changes.set_computed(r, min(valid_tokens, r.num_computed_tokens))
            self.counts["load_failed"] += 1

    def truncate_failed_load(self, r: SReq, valid_tokens: int) -> None:
        """An asynchronous load reports invalid blocks under the ``fail`` policy (0.33
        ``_handle_invalid_blocks``): ``num_computed_tokens`` truncated at the first invalid block;
        the scheduler then finishes the request with an error while its load is still pending, so
        its blocks are freed when the load reports done, as after an abort."""
        assert r.recv == "pending", f"{r.request_id} has no load pending"
        self.changes.set_computed(r, valid_tokens)

    def abort_while_loading(self, r: SReq) -> None:
        """``finish_requests(ABORTED)`` of a request whose load was posted and has not finished:
        free only on arrival (vLLM delays it, ``arrived_after_abort``)."""
        if self.cfg.connector:
            self.emit(O.RemoveSkippedBlocks(r.request_id, r.num_computed_tokens))
        r.aborted = True
        self.loading_aborted[r.request_id] = r
        self.counts["abort_while_loading"] += 1

    def reservation(self, inflight_prefills: set[str], reqs: Mapping[str, SReq]) -> int:
        """vLLM 0.33 ``_inflight_prefill_reserved_blocks`` + ``_spec_decode_step_blocks``: what an
        asynchronous load's admission sets aside for the in-flight prefills (``load_reservation``)."""
        if self.load_reservation is None:
            return 0
        cfg = self.cfg
        step = 1 + cfg.num_spec_tokens + cfg.num_lookahead_tokens if cfg.num_spec_tokens else 0
        pending = [
            (rid, min(r.num_tokens, cfg.max_model_len) + step, r.num_computed_tokens)
            for rid in sorted(inflight_prefills)
            if (r := reqs.get(rid)) is not None
        ]
        return self.load_reservation(pending, step)

    def ask_connector(self, r: SReq, local: int, ch: Choices) -> tuple[int, bool]:
        """``get_num_new_matched_tokens``: how many more prompt tokens a remote holds, sync or async."""
        room = r.num_tokens - local
        if room <= 0 or not ch.boolean(f"connector_hit:{r.request_id}"):
            return 0, False
        if ch.boolean(f"async_load:{r.request_id}"):
            # An async load may cover the whole prompt (then the last token is recomputed).
            return ch.integer(1, room, f"ext_async:{r.request_id}", boundary=self.cfg.block_size), True
        if room <= 1:
            return 0, False
        return ch.integer(1, room - 1, f"ext_sync:{r.request_id}", boundary=self.cfg.block_size), False

    def update_waiting_for_remote_kv(self, r: SReq) -> None:
        """0.33 ``_update_waiting_for_remote_kv`` + status promotion (``_handle_blocked_waiting_request``)."""
        if r.recv == "failed":
            if r.num_computed_tokens:
                self.emit(O.CacheBlocks(r.request_id, r.num_computed_tokens))
            else:
                self.emit(O.Free(r.request_id))
        else:
            self.emit(O.CacheBlocks(r.request_id, r.num_computed_tokens))
        if r.num_computed_tokens == r.num_tokens:
            self.changes.set_computed(r, r.num_tokens - 1)
        r.recv = None
        self.changes.set_status(r, RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING)
        self.counts["promote_after_load"] += 1

    # --- invalid blocks of synchronous loads ---------------------------------------------------

    def recover_invalid_blocks(
        self, scheduled: dict[str, int], running: Mapping[str, SReq], ch: Choices, holding: Mapping[str, SReq]
    ) -> tuple[list[str], bool, list[str]]:
        """The invalid blocks of this step's synchronous loads, drawn and handled: the running
        requests affected (their output is skipped), whether the ``fail`` policy fails them after
        the step's output (else they recompute), and the asynchronous loads ``fail`` fails too
        (``holding``: the requests in WAITING_FOR_REMOTE_KVS, in ``kv_holding_waiting`` order)."""
        invalid, recompute = self._invalid_blocks(scheduled, running, ch)
        if not invalid:
            return [], False, []
        held = self._poison_holders(invalid, recompute, holding)
        return self._handle_invalid_blocks(invalid, recompute, scheduled, running), not recompute, held

    def _poison_holders(self, invalid: set[int], recompute: bool, holding: Mapping[str, SReq]) -> list[str]:
        """vLLM 0.33 ``_handle_invalid_blocks`` scans the asynchronous loads first (nothing evicted):
        one whose computed blocks (a prefix hit included) hold an invalid block is truncated at the
        first one it is the first to hold, and fails: under ``recompute`` when its load arrives
        (``failed_recving_kv_req_ids``: ``update_waiting_for_remote_kv`` then caches what is left
        or frees), under ``fail`` at once (returned: finished after the step's output)."""
        failed = self._truncate_holders(invalid, {}, holding)[0]
        if not recompute:
            return failed
        for rid in failed:
            r = holding[rid]
            if r.recv == "pending":
                r.load_poisoned = True
            else:
                r.recv = "failed"
            self.counts["load_invalid_shared"] += 1
        return []

    def _invalid_blocks(
        self, scheduled: dict[str, int], running: Mapping[str, SReq], ch: Choices
    ) -> tuple[set[int], bool]:
        """The world's answer for this step's synchronous loads: the blocks reported invalid (one
        per failing load, among the blocks it loaded) and the policy (``recompute``, else ``fail``:
        the connector's ``kv_load_failure_policy``, drawn once per step)."""
        bs = self.cfg.block_size
        invalid: set[int] = set()
        recompute: bool | None = None
        for rid in scheduled:
            r = running.get(rid)
            if r is None:
                continue
            ext, r.sync_ext_this_step = r.sync_ext_this_step, 0
            if not (ext and self.cfg.single_group and self.table is not None):
                continue
            if not ch.boolean(f"sync_load_fails:{rid}"):
                continue
            before = r.num_computed_tokens - scheduled[rid]
            # The worker reports real blocks only: a null (window-skipped) position is never invalid.
            table = self.table(rid)
            loaded = [j for j in range((before - ext) // bs, min(-(-before // bs), len(table))) if table[j]]
            if not loaded:
                continue
            invalid.add(table[loaded[ch.integer(0, len(loaded) - 1, f"invalid_block:{rid}")]])
            if recompute is None:
                recompute = ch.boolean(f"recompute_kv_load_failures:{rid}")
        return invalid, bool(recompute)

    def _truncate_holders(
        self, invalid: set[int], scheduled: dict[str, int], requests: Mapping[str, SReq]
    ) -> tuple[list[str], set[int]]:
        """0.33 ``_update_requests_with_invalid_blocks`` over ``requests`` in order: each holding an
        invalid block among the blocks computed before this step is affected; the first to hold a
        block has ``num_computed_tokens`` truncated there (later holders of it keep their count
        before this step).  Returns the affected requests and the blocks from each truncation on."""
        assert self.table is not None
        bs = self.cfg.block_size
        marked: set[int] = set()
        affected: list[str] = []
        evict: set[int] = set()
        for rid, r in requests.items():
            before = r.num_computed_tokens - scheduled.get(rid, 0)
            table = self.table(rid)
            hit = truncated = False
            for idx, b in zip(range(-(-before // bs)), table):
                if b not in invalid:
                    continue
                hit = True
                if b in marked:
                    continue
                marked.add(b)
                if not truncated:
                    truncated = True
                    self.changes.set_computed(r, idx * bs)
                    evict.update(x for x in table[idx:] if x)
            if hit:
                if not truncated:
                    self.changes.set_computed(r, before)
                affected.append(rid)
        return affected, evict

    def _handle_invalid_blocks(
        self, invalid: set[int], recompute: bool, scheduled: dict[str, int], running: Mapping[str, SReq]
    ) -> list[str]:
        """vLLM 0.33 ``_handle_invalid_blocks`` for running requests: every running request holding
        an invalid block among the blocks computed before this step is affected; the first to hold
        a block has ``num_computed_tokens`` truncated there (later holders of that block keep their
        count before this step).  ``fail`` evicts the table from each truncation on (the scheduler
        fails the affected requests after the step's output).  Returns the affected requests, in
        running order (their output is skipped); the asynchronous loads are scanned before
        (``_poison_holders``)."""
        affected, evict = self._truncate_holders(invalid, scheduled, running)
        if recompute:
            self.counts["load_invalid_recompute"] += len(affected)
        elif evict:
            self.emit(O.EvictBlocks(tuple(sorted(evict))))
            self.counts["evict_blocks"] += 1
        return affected
