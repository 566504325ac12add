"""The KV-content oracle's model runner: what each scheduler-side event means for the KV cache.

``KVCheckTarget`` (``harness.oracle.target``) feeds every operation to the shared op -> KV-event mapping
(``harness.ledger.schedule.KVSchedule``, whose book holds ``OracleRequest``), and the ``ModelRunner`` is
its consumer: blocks handed out fresh or released (poisoned with NaN), connector loads, model runs.
The runner writes and reads the paged cache (``harness.oracle.paged``) through the tables of the latest
observation, checks against the dense reference (``harness.oracle.dense``) and raises ``KVMismatch`` on
wrong numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.ledger.schedule import ModelRun, Publication
from kvspec.harness.oracle.dense import DenseRun, dense_reference, row_errors
from kvspec.harness.oracle.finding import BadKV, KVFinding, KVMismatch, fmt_positions
from kvspec.harness.oracle.paged import PagedKV
from kvspec.harness.oracle.request import LORA_SLOTS, OracleRequest
from kvspec.impl.paged.attention import first_visible_position
from kvspec.impl.paged.model import LayerSpec


@dataclass
class OracleStats:
    """What the oracle did since construction (``seconds``: time spent in the oracle itself,
    the inner target's own time and the observations' excluded / included as labelled)."""

    ops: int = 0
    model_runs: int = 0
    tokens_checked: int = 0
    hit_tokens_checked: int = 0
    external_tokens_written: int = 0
    blocks_poisoned: int = 0
    observations: int = 0
    oracle_seconds: float = 0.0  # model, reference, comparisons, poisoning (no inner call, no observe)
    observe_seconds: float = 0.0  # inner.observe() calls made for the oracle
    inner_seconds: float = 0.0  # inner.apply()
    known_bugs: Counter[str] = field(default_factory=Counter)  # runs stopped by a known target bug, by id


class ModelRunner:
    """Plays vLLM's model runner against the tables of ``obs`` (set by the wrapper); findings name
    the operation ``op`` (number ``op_index``) of ``target``."""

    def __init__(self, kv: PagedKV, stats: OracleStats, target: object) -> None:
        self.kv = kv
        self.stats = stats
        self.target = target
        self.loras: dict[tuple[str, str], int] = {}
        self.obs: Observation | None = None
        self.op_index = -1
        self.op: O.Op | None = None

    def new_request(self, rec: BookRequest) -> OracleRequest:
        lora = rec.lora
        slot = 0 if lora is None else 1 + self.loras.setdefault(lora, len(self.loras)) % LORA_SLOTS
        return OracleRequest(rec, lora_slot=slot)

    # --- the events of the op -> KV mapping (harness.ledger.schedule.KVEvents) ----------------------------

    def fresh(self, r: OracleRequest, blocks: set[int]) -> None:
        """Blocks an allocation added that are not the request's prefix hits hold garbage: NaN."""
        self.stats.blocks_poisoned += self.kv.poison(blocks)

    def released(self, candidates: Collection[int] | None) -> None:
        self.poison_released()  # scans every written block: a buggy target may release any of them

    def load(self, r: OracleRequest, a: int, b: int, delayed: bool = False) -> None:
        self._load_external(r, a, b)

    def run(self, r: OracleRequest, run: ModelRun) -> None:
        self._model_run(r, run)

    def appended(self, r: OracleRequest, old_num_tokens: int) -> None:
        """Positions computed before their token was known (async-scheduling placeholders, computed
        here with ``FILLER``) hold the KV of the token now appended, as the GPU computed them with it
        (docs/semantics.md §11.1); positions rolled back since (padded drafts) are left alone."""
        known = [p for p in sorted(r.placeholders) if p < r.rec.num_tokens]
        r.placeholders.difference_update(known)
        tables = self._tables(r)
        for p in known:
            mapped = all(p // self.kv.block_sizes[sp.group] < len(tables[sp.group]) for _, sp in self.kv.layers)
            if p < r.rec.num_computed_tokens and mapped:
                self.kv.load(tables, p, p + 1, self._dense(r, p + 1))

    def published(self, r: OracleRequest, blocks: list[Publication], promised_end: int) -> None:
        pass  # a hit on an unwritten block shows as NaN when it is read

    def poison_released(self) -> None:
        assert self.obs is not None
        self.stats.blocks_poisoned += self.kv.poison_released(self.obs)

    # --- model runs, loads, hit checks -----------------------------------------------------------

    def _dense(self, r: OracleRequest, n: int) -> DenseRun:
        seq = r.virtual(r.sequence(n))
        d = r.dense
        if d is None or len(d.tokens) < n or d.tokens[:n] != seq:
            d = r.dense = dense_reference(self.kv.model, seq)
        return d

    def _tables(self, r: OracleRequest) -> list[tuple[int, ...]]:
        assert self.obs is not None
        return [t.get(r.rid, ()) for t in self.obs.tables]

    def _load_external(self, r: OracleRequest, a: int, b: int) -> None:
        """The KV connector writes the dense KV of positions ``[a, b)`` into the request's blocks."""
        tables = self._tables(r)
        self._check_mapped(r, tables, a, b, "externally loaded", allow_null=True)
        self.kv.load(tables, a, b, self._dense(r, b))
        self.stats.external_tokens_written += b - a

    def _model_run(self, r: OracleRequest, run: ModelRun) -> None:
        """The model computes positions ``[s, n)`` of ``r`` through its block tables, after the hits
        are verified and a pending connector load has landed."""
        s, n = run.start, run.end
        known = len(r.known_tokens())
        r.placeholders.difference_update(range(s, min(n, known)))
        r.placeholders.update(range(max(s, known), n))  # computed with FILLER: the token comes later
        tables = self._tables(r)
        self._check_ids(r, tables)
        self._check_mapped(r, tables, s, n, "computed")
        d = self._dense(r, n)
        self._verify_hits(r, tables, d, run.hits)
        if run.arrival is not None:  # the load must have arrived before the request runs again
            self._load_external(r, *run.arrival)
        out = self.kv.forward(d.tokens[s:n], s, tables)  # [T, d_model]
        self.stats.model_runs += 1
        self.stats.tokens_checked += n - s
        bad, _, max_abs, max_rel = row_errors(out, d.hidden[s:n], self.kv.tol)
        if bool(bad.any()):
            positions = [s + i for i, x in enumerate(bad.tolist()) if x]
            self._output_mismatch(r, tables, d, s, n, positions, max_abs, max_rel)

    def _verify_hits(
        self, r: OracleRequest, tables: list[tuple[int, ...]], d: DenseRun, ranges: list[tuple[int, int]]
    ) -> None:
        """Prefix-hit positions must hold the dense KV of this request's own prefix."""
        for a, b in ranges:
            self._check_mapped(r, tables, a, b, "prefix-hit", allow_null=True)

            def hit_positions(spec: LayerSpec, table: Sequence[int], bs: int, a: int = a, b: int = b) -> list[int]:
                return [p for p in range(a, b) if table[p // bs] != 0]

            bad_kv, max_abs, max_rel = self.kv.compare_kv(tables, d, hit_positions, b)
            self.stats.hit_tokens_checked += b - a
            if bad_kv:
                first = min(bad_kv, key=lambda x: x.layer)
                positions = sorted({p for x in bad_kv for p in x.positions})
                blocks = sorted({x.block_id for x in bad_kv})
                what = (
                    "NaN: the blocks were never written or were freed"
                    if all(x.nan for x in bad_kv)
                    else f"largest error {max_abs:.3g}: another sequence's KV"
                )
                summary = (
                    f"request {r.rid}: prefix-cache hit positions {fmt_positions(positions)} in block(s) "
                    f"{blocks} do not hold the KV of {r.rid}'s own prefix ({what}; "
                    f"first at layer {first.layer}, group {first.group})"
                )
                args = (positions, first.group, first.layer, blocks, max_abs, max_rel)
                self._raise("prefix-hit", r, *args, summary, bad_kv)

    # --- diagnosis -------------------------------------------------------------------------------

    def _check_ids(self, r: OracleRequest, tables: list[tuple[int, ...]]) -> None:
        """Every id in the request's tables must name a block of the pool (0 = null)."""
        nb = self.kv.num_blocks
        for _, spec in self.kv.layers:
            g = spec.group
            bad = sorted({b for b in tables[g] if not 0 <= b < nb})
            if bad:
                summary = f"request {r.rid}: group {g} table holds block id(s) {bad} outside the pool of {nb}"
                self._raise("unmapped-slot", r, [], g, None, bad, math.inf, math.inf, summary)

    def _check_mapped(
        self, r: OracleRequest, tables: list[tuple[int, ...]], lo: int, hi: int, what: str, allow_null: bool = False
    ) -> None:
        """Every position in ``[lo, hi)`` must lie inside the request's table in every decoder group,
        on a block id of the pool, and (unless ``allow_null``) not on the null block."""
        nb = self.kv.num_blocks
        first_ok = 0 if allow_null else 1
        for _, spec in self.kv.layers:
            g = spec.group
            bs = self.kv.block_sizes[g]
            table = tables[g]
            bad = [p for p in range(lo, hi) if p // bs >= len(table) or not first_ok <= table[p // bs] < nb]
            if bad:
                blocks = sorted({table[p // bs] for p in bad if p // bs < len(table)})
                summary = (
                    f"request {r.rid}: {what} positions {fmt_positions(bad)} have no usable block in group {g} "
                    f"(table {list(table)}, block size {bs})"
                )
                self._raise("unmapped-slot", r, bad, g, None, blocks, math.inf, math.inf, summary)

    def _output_mismatch(
        self,
        r: OracleRequest,
        tables: list[tuple[int, ...]],
        d: DenseRun,
        s: int,
        n: int,
        positions: list[int],
        max_abs: float,
        max_rel: float,
    ) -> NoReturn:
        """Find the first layer whose visible K/V differ from the dense KV, and name its blocks."""

        def visible(spec: LayerSpec, table: Sequence[int], bs: int) -> list[int]:
            return list(range(first_visible_position(s, spec.kind, spec.window), n))

        bad_kv, _, _ = self.kv.compare_kv(tables, d, visible, n)
        where = ""
        layer = group = None
        groups = {sp.group for _, sp in self.kv.layers}
        blocks = sorted({tables[g][p // self.kv.block_sizes[g]] for g in groups for p in range(s, n)})
        if bad_kv:
            first_layer = min(x.layer for x in bad_kv)
            bad_kv = [x for x in bad_kv if x.layer == first_layer]
            layer, group = first_layer, bad_kv[0].group
            blocks = sorted({x.block_id for x in bad_kv})
            kv_pos = sorted({p for x in bad_kv for p in x.positions})
            why = (
                "the null block (a block dropped while still in the window)"
                if 0 in blocks
                else "NaN: freed or never written"
                if all(x.nan for x in bad_kv)
                else "another sequence's KV"
            )
            where = (
                f"; layer {layer} (group {group}) reads wrong KV at positions {fmt_positions(kv_pos)} "
                f"in block(s) {blocks}: {why}"
            )
        err = "NaN" if not math.isfinite(max_abs) else f"{max_abs:.3g}"
        summary = (
            f"request {r.rid}: attention over the paged cache differs from dense attention at positions "
            f"{fmt_positions(positions)} (largest abs error {err}){where}"
        )
        self._raise("attention-output", r, positions, group, layer, blocks, max_abs, max_rel, summary, bad_kv)

    def _raise(
        self,
        kind: str,
        r: OracleRequest,
        positions: list[int],
        group: int | None,
        layer: int | None,
        blocks: list[int],
        max_abs: float,
        max_rel: float,
        summary: str,
        bad_kv: list[BadKV] | None = None,
    ) -> NoReturn:
        assert self.op is not None
        raise KVMismatch(
            KVFinding(
                kind=kind,
                target=getattr(self.target, "name", type(self.target).__name__),
                request_id=r.rid,
                op_index=self.op_index,
                op=op_to_json(self.op),
                positions=list(positions),
                group=group,
                layer=layer,
                block_ids=list(blocks),
                max_abs_err=max_abs,
                max_rel_err=max_rel,
                summary=summary,
                bad_kv=list(bad_kv or []),
                dtype=str(self.kv.dtype).replace("torch.", ""),
                tolerance=dict(self.kv.tol),
            )
        )
