"""The KV-transfer side of kvspec's scheduler model (``harness.world.scheduler``): a KV connector's answers
(``get_num_new_matched_tokens``), asynchronous loads that arrive, fail or are aborted meanwhile,
synchronous loads that report invalid blocks, and the blocks an asynchronous load's admission sets
aside for in-flight prefills (vLLM 0.33 ``Scheduler``: ``_update_waiting_for_remote_kv``,
``_handle_invalid_blocks``, ``_inflight_prefill_reserved_blocks``).

``KVTransfers`` is a part of ``harness.world.scheduler.Scheduler`` (its base class), split along vLLM's
own seam; it reads and changes the scheduler's requests through the scheduler's own helpers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.core import ops as O
from spec.request import RequestStatus

if TYPE_CHECKING:
    from harness.world.scheduler import SchedConfig, SReq
    from harness.world.workload import Choices


class KVTransfers:
    """The connector side of the scheduler model (see the module docstring)."""

    cfg: SchedConfig
    ch: Choices
    emit: Callable[[O.Op], Any]
    table: Callable[[str], tuple[int, ...]] | None
    reqs: dict[str, SReq]
    running: list[str]
    loading_aborted: dict[str, SReq]
    counts: Counter[str]
    inflight_prefills: set[str]
    load_reservation: Callable[[list[tuple[str, int, int]], int], int] | None

    if TYPE_CHECKING:

        def _set_computed(self, r: SReq, n: int) -> None: ...

        def _set_status(self, r: SReq, status: RequestStatus) -> None: ...

        def _remove(self, rid: str) -> SReq: ...

        def abort(self, rid: str) -> None: ...

    def kv_arrives(self, rid: str, ok: bool, valid_tokens: int = 0) -> None:
        """The worker reports ``finished_recving`` (or a failed load) for an async P/D load."""
        if rid in self.loading_aborted:
            r = self.loading_aborted.pop(rid)
            self.emit(O.Free(rid))
            self.counts["free_after_load"] += 1
            return
        r = self.reqs[rid]
        assert r.recv == "pending"
        if ok:
            r.recv = "done"
            self.counts["load_ok"] += 1
        else:
            r.recv = "failed"
            self._set_computed(r, valid_tokens)
            self.counts["load_failed"] += 1

    def fail_load(self, rid: str, valid_tokens: int) -> None:
        """An asynchronous load reports invalid blocks under the ``fail`` policy (0.33
        ``_handle_invalid_blocks``): ``num_computed_tokens`` truncated at the first invalid block,
        then the request is finished with an error while its load is still pending, so its blocks
        are freed when the load reports done, as after an abort."""
        r = self.reqs[rid]
        assert r.recv == "pending", f"{rid} has no load pending"
        self._set_computed(r, valid_tokens)
        self.abort(rid)

    def _load_reservation(self) -> int:
        """vLLM 0.33 ``_inflight_prefill_reserved_blocks`` + ``_spec_decode_step_blocks``: what an
        asynchronous load's admission sets aside (see ``load_reservation``)."""
        if self.load_reservation is None:
            return 0
        cfg = self.cfg
        step = 1 + cfg.num_spec_tokens + cfg.num_lookahead_tokens if cfg.num_spec_tokens else 0
        pending = [
            (rid, min(r.num_tokens, cfg.max_model_len) + step, r.num_computed_tokens)
            for rid in sorted(self.inflight_prefills)
            if (r := self.reqs.get(rid)) is not None
        ]
        return self.load_reservation(pending, step)

    def _ask_connector(self, r: SReq, local: int) -> tuple[int, bool]:
        """``get_num_new_matched_tokens``: how many more prompt tokens a remote holds, sync or async."""
        room = r.num_tokens - local
        if room <= 0 or not self.ch.boolean(f"connector_hit:{r.request_id}"):
            return 0, False
        if self.ch.boolean(f"async_load:{r.request_id}"):
            # An async load may cover the whole prompt (then the last token is recomputed).
            return self.ch.integer(1, room, f"ext_async:{r.request_id}", boundary=self.cfg.block_size), True
        if room <= 1:
            return 0, False
        return self.ch.integer(1, room - 1, f"ext_sync:{r.request_id}", boundary=self.cfg.block_size), False

    def _update_waiting_for_remote_kv(self, r: SReq) -> None:
        """0.33 ``_update_waiting_for_remote_kv`` + status promotion (``_handle_blocked_waiting_request``)."""
        if r.recv == "failed":
            if r.num_computed_tokens:
                self.emit(O.CacheBlocks(r.request_id, r.num_computed_tokens))
            else:
                self.emit(O.Free(r.request_id))
        else:
            self.emit(O.CacheBlocks(r.request_id, r.num_computed_tokens))
        if r.num_computed_tokens == r.num_tokens:
            self._set_computed(r, r.num_tokens - 1)
        r.recv = None
        self._set_status(r, RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING)
        self.counts["promote_after_load"] += 1

    def _invalid_blocks(self, scheduled: dict[str, int]) -> tuple[set[int], bool]:
        """The world's answer for this step's synchronous loads: the blocks reported invalid (one
        per failing load, among the blocks it loaded) and the policy (``recompute``, else ``fail``:
        the connector's ``kv_load_failure_policy``, drawn once per step)."""
        bs = self.cfg.block_size
        invalid: set[int] = set()
        recompute: bool | None = None
        for rid in scheduled:
            r = self.reqs.get(rid)
            if r is None or rid not in self.running:
                continue
            ext, r.sync_ext_this_step = r.sync_ext_this_step, 0
            if not (ext and self.cfg.single_group and self.table is not None):
                continue
            if not self.ch.boolean(f"sync_load_fails:{rid}"):
                continue
            before = r.num_computed_tokens - scheduled[rid]
            # The worker reports real blocks only: a null (window-skipped) position is never invalid.
            table = self.table(rid)
            loaded = [j for j in range((before - ext) // bs, min(-(-before // bs), len(table))) if table[j]]
            if not loaded:
                continue
            invalid.add(table[loaded[self.ch.integer(0, len(loaded) - 1, f"invalid_block:{rid}")]])
            if recompute is None:
                recompute = self.ch.boolean(f"recompute_kv_load_failures:{rid}")
        return invalid, bool(recompute)

    def _handle_invalid_blocks(
        self, invalid: set[int], recompute: bool, scheduled: dict[str, int], failed: list[SReq]
    ) -> set[str]:
        """vLLM 0.33 ``_handle_invalid_blocks`` for running requests: every running request holding
        an invalid block among the blocks computed before this step is affected; the first to hold
        a block has ``num_computed_tokens`` truncated there (later holders of that block keep their
        count before this step).  ``fail`` evicts the table from each truncation on and fails the
        affected requests after the step's output.  Returns the affected requests (their output
        is skipped).  Asynchronous loads sharing such a block are not modelled."""
        assert self.table is not None
        bs = self.cfg.block_size
        marked: set[int] = set()
        affected: list[str] = []
        evict: set[int] = set()
        for rid in list(self.running):
            r = self.reqs[rid]
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
                    self._set_computed(r, idx * bs)
                    evict.update(x for x in table[idx:] if x)
            if hit:
                if not truncated:
                    self._set_computed(r, before)
                affected.append(rid)
        if recompute:
            self.counts["load_invalid_recompute"] += len(affected)
            return set(affected)
        if evict:
            self.emit(O.EvictBlocks(tuple(sorted(evict))))
            self.counts["evict_blocks"] += 1
        failed.extend(self._remove(rid) for rid in affected)  # failed after the output (``finish_requests``)
        return set(affected)
