"""The KV-content oracle: wrapped around any target, it checks the numbers the model would read.

Block ids that agree with the spec do not prove that attention reads the right K and V.  A
``KVCheckTarget`` wraps a target (spec, vLLM 0.33's manager, ``impl``, a user's) and plays the
model runner next to it: for every chunk the scheduler computes it runs a tiny seeded transformer
(``impl.model.TinyTransformer``) through a paged KV cache, writing K/V into the block ids the
target's tables give and attending through them, and compares the result with a dense, cache-free
float64 reference over the request's own tokens.  It never consults the spec, so reuse of a block
still in use, a hash published before its KV was written, a hit on a block with another prefix, or
a window that dropped a block too early show up as wrong numbers on their own.

How the operations of ``harness.ops`` map onto the model runner (vLLM 0.33 ``GPUModelRunner`` /
``Scheduler`` semantics):

- ``SetNumComputedTokens(rid, n)`` with ``n`` above the previous count ``p``: positions ``[p, n)``
  became computed.  The last successful ``AllocateSlots`` of the request (made at computed count
  ``c``, with ``h = num_new_computed_tokens`` and ``e = num_external_computed_tokens``) says which
  of them are prefix-cache hits (``[c, c+h)``), which are loaded by a KV connector (``[c+h, c+h+e)``)
  and which the model computes (the rest).  Model positions run ``forward_chunk`` over the tables of
  the last observation (drafts included past ``num_tokens``: the token sequence is ``all_token_ids``
  + the scheduled drafts + a filler token for padded slots) and are compared with ``forward_dense``
  over the same sequence.
- Hit positions must already hold the dense KV of *this* request's prefix.  They are checked just
  before the request's next model run (a hit may legally point at blocks another request computes
  earlier in the same engine step: vLLM caches them at allocation time).
- Connector positions are written with the dense KV when the load arrives: at once for a
  synchronous load, and for ``delay_cache_blocks`` (async P/D) at the request's ``CacheBlocks``
  (the scheduler's arrival call), or at the latest before its next model run.  A decrease of the
  computed count (failed load: valid prefix only) truncates a pending load.
- Poisoning with NaN: blocks that an ``AllocateSlots`` adds to a table and that are not the
  request's prefix hits (fresh blocks hold garbage), and blocks that reach ``ref_cnt == 0`` without
  a hash (nothing may read them again); hashed free blocks keep their contents (a later hit reads
  them).  A read of a poisoned slot turns the output into NaN, which never passes.
- A decrease of the computed count (spec-decode rejection, preemption) needs nothing: the rolled
  back positions are rewritten before anything reads them.

Layers: each decoder KV-cache group gets ``layers_per_group`` layers of its attention kind (full,
sliding window ``W``, chunked local ``C``), interleaved group by group so that every group's KV
depends on every group's earlier layers.  Cross-attention groups are skipped (their KV comes from
an encoder the tiny model does not have); their block ids still take part in poisoning.
LoRA adapters and multimodal items change the numbers as they do in a real model: a request's LoRA
shifts its token embeddings into another range of the vocabulary, and multimodal placeholder
positions take embeddings derived from the item's identifier.  ``cache_salt`` changes no number.

A mismatch raises ``KVMismatch`` carrying a ``KVFinding``: the request, the token positions, the
group and layer, the block ids holding wrong KV (NaN: freed or never written), the largest error,
and a one-line summary, with ``to_json`` / ``to_markdown`` for the report's "KV contents" section.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness import ops as O
from harness.observation import Observation
from harness.targets.base import Target, Unsupported
from impl.attention import dense_attention, first_visible_position
from impl.kv_cache import default_device, slot_mapping
from impl.model import LayerSpec, ModelConfig, TinyTransformer, tolerance
from spec.config import KVCacheConfig

BASE_VOCAB = 64  # token ids are taken modulo this
LORA_SLOTS = 4  # distinct LoRA adapters that get distinct embeddings (more wrap around)
MM_BASE = BASE_VOCAB * (1 + LORA_SLOTS)  # multimodal placeholder embeddings start here
VOCAB = MM_BASE + BASE_VOCAB
FILLER = -1  # token of padded draft slots the scheduler computes but never shows (pad_spec_decode)

# Operations that change only the scheduler's request object: the manager's state cannot change.
_REQUEST_ONLY = (O.AddRequest, O.AppendOutputTokens, O.SetSpecTokens, O.SetNumComputedTokens, O.SetStatus)


# --- findings ------------------------------------------------------------------------------------


def _fmt_positions(ps: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7-8``."""
    out: list[str] = []
    ps = sorted(set(ps))
    i = 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[j] + 1:
            j += 1
        out.append(str(ps[i]) if i == j else f"{ps[i]}-{ps[j]}")
        i = j + 1
    return ", ".join(out)


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else "inf")


@dataclass
class BadKV:
    """Slots of one block, in one layer, whose K/V differ from the dense reference."""

    layer: int
    group: int
    block_id: int
    positions: list[int]
    nan: bool  # the slots hold NaN: freed, fresh (never written) or the null block


@dataclass
class KVFinding:
    """One KV-content mismatch, as the report's "KV contents" section shows it."""

    kind: str  # attention-output | prefix-hit | unmapped-slot
    target: str
    request_id: str
    op_index: int  # index of the operation (0-based, counted since reset) at which it showed
    op: dict[str, Any]
    positions: list[int]  # token positions whose output / KV is wrong (or unmapped)
    group: int | None
    layer: int | None
    block_ids: list[int]
    max_abs_err: float
    max_rel_err: float
    summary: str
    bad_kv: list[BadKV] = field(default_factory=list)
    dtype: str = "float32"
    tolerance: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["max_abs_err"] = _json_float(self.max_abs_err)
        out["max_rel_err"] = _json_float(self.max_rel_err)
        return out

    def to_markdown(self) -> str:
        err = (
            "NaN (a poisoned slot was read)"
            if math.isnan(self.max_abs_err) or math.isinf(self.max_abs_err)
            else (f"{self.max_abs_err:.3g} abs, {self.max_rel_err:.3g} rel")
        )
        lines = [
            "## KV contents",
            "",
            self.summary,
            "",
            "| field | value |",
            "|---|---|",
            f"| kind | {self.kind} |",
            f"| target | {self.target} |",
            f"| request | `{self.request_id}` |",
            f"| operation | #{self.op_index} `{self.op.get('op')}` |",
            f"| token positions | {_fmt_positions(self.positions)} |",
            f"| group / layer | {self.group} / {self.layer} |",
            f"| block ids | {', '.join(map(str, self.block_ids)) or '-'} |",
            f"| largest error | {err} |",
            f"| dtype, tolerance | {self.dtype}, rtol {self.tolerance.get('rtol')} atol {self.tolerance.get('atol')} |",
        ]
        if self.bad_kv:
            lines += ["", "| layer | group | block | positions | contents |", "|---|---|---|---|---|"]
            for b in self.bad_kv:
                what = "NaN (freed / never written / null block)" if b.nan else "another sequence's KV"
                lines.append(f"| {b.layer} | {b.group} | {b.block_id} | {_fmt_positions(b.positions)} | {what} |")
        return "\n".join(lines) + "\n"


class KVMismatch(Exception):
    """The paged cache gave different numbers from the dense reference; ``finding`` says where."""

    def __init__(self, finding: KVFinding) -> None:
        super().__init__(finding.summary)
        self.finding = finding


# --- dense reference -------------------------------------------------------------------------------


@dataclass
class DenseRun:
    """``forward_dense`` of one token sequence, with each layer's K/V kept."""

    tokens: tuple[int, ...]
    hidden: torch.Tensor  # [N, d_model] float64
    k: list[torch.Tensor]  # per layer [N, Hkv, D] float64
    v: list[torch.Tensor]  # per layer [N, Hkv, D] float64


def dense_reference(model: TinyTransformer, tokens: Sequence[int]) -> DenseRun:
    """``TinyTransformer.forward_dense`` in float64, also returning every layer's K/V (same maths,
    step for step; a test checks the hidden states against ``forward_dense``)."""
    ids = torch.as_tensor(list(tokens), dtype=torch.long, device=model.device)  # [N]
    pos = torch.arange(ids.numel(), device=model.device)  # [N]
    x = model.embed[ids].to(torch.float64)  # [N, d_model]
    ks, vs = [], []
    for spec, wts in zip(model.config.layers, model.weights):
        q, k, v = model._qkv(x, wts, pos)  # [N, Hq, D], [N, Hkv, D], [N, Hkv, D]
        ks.append(k)
        vs.append(v)
        attn = dense_attention(q, k, v, pos, spec.kind, spec.window)  # [N, Hq, D]
        x = model._finish(x, attn, wts)  # [N, d_model]
    return DenseRun(tuple(tokens), x, ks, vs)


def _errors(actual: torch.Tensor, expected: torch.Tensor, tol: dict[str, float]):
    """Row-wise check of ``actual`` [P, ...] against ``expected`` [P, ...] (float64).

    Returns (bad rows [P] bool, NaN rows [P] bool, max abs error, max rel error); NaN counts as inf.
    """
    a = actual.to(torch.float64).reshape(actual.shape[0], -1)  # [P, F]
    e = expected.to(torch.float64).reshape(expected.shape[0], -1)  # [P, F]
    err = (a - e).abs()  # [P, F]
    nan = torch.isnan(err)  # [P, F]
    err = torch.where(nan, torch.full_like(err, math.inf), err)  # [P, F]
    bad = err > tol["atol"] + tol["rtol"] * e.abs()  # [P, F]
    if err.numel() == 0:
        return bad.any(-1), nan.any(-1), 0.0, 0.0
    rel = err / e.abs().clamp_min(1e-12)  # [P, F]
    return bad.any(-1), nan.any(-1), float(err.max()), float(rel.max())


# --- per-request bookkeeping ------------------------------------------------------------------------


@dataclass
class _Alloc:
    """The last successful ``allocate_slots`` of a request, in token positions."""

    start: int  # num_computed_tokens when it ran
    hit: int  # num_new_computed_tokens
    ext: int  # num_external_computed_tokens
    delay: bool  # delay_cache_blocks: the external KV arrives later


class _Req:
    __slots__ = (
        "rid",
        "tokens",
        "lora_slot",
        "mm",
        "drafts",
        "sched_drafts",
        "computed",
        "alloc",
        "pending_hit",
        "pending_ext",
        "lookup",
        "dense",
    )

    def __init__(self, op: O.AddRequest, lora_slot: int) -> None:
        self.rid = op.request_id
        self.tokens: list[int] = list(op.prompt_token_ids)
        self.lora_slot = lora_slot
        self.mm = tuple((m.identifier, m.offset, m.length) for m in op.mm_features)
        self.drafts: tuple[int, ...] = ()  # request.spec_token_ids
        self.sched_drafts: tuple[int, ...] = ()  # drafts cleared when scheduled, until the step ends
        self.computed = 0
        self.alloc: _Alloc | None = None
        self.pending_hit: list[tuple[int, int]] = []  # hit ranges to verify before the next model run
        self.pending_ext: tuple[int, int] | None = None  # async connector load not yet arrived
        self.lookup: list[list[int]] | None = None  # block ids of the last get_computed_blocks
        self.dense: DenseRun | None = None

    def sequence(self, n: int) -> list[int]:
        """Raw token ids of positions ``[0, n)``: verified tokens, then drafts, then filler."""
        seq = self.tokens + list(self.drafts or self.sched_drafts)
        return (seq + [FILLER] * max(0, n - len(seq)))[:n]


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


# --- the wrapper ---------------------------------------------------------------------------------------


class KVCheckTarget:
    """A ``Target`` that forwards every operation to ``inner`` and checks KV contents alongside.

    ``apply`` returns the inner outcome unchanged and raises ``KVMismatch`` when the numbers go
    wrong; exceptions of the inner target (``Unsupported`` included) pass through untouched.
    ``poison=False`` turns NaN poisoning off (only for showing that it matters).
    """

    def __init__(
        self,
        inner: Target,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        model_seed: int = 0,
        *,
        layers_per_group: int = 2,
        poison: bool = True,
        tol: dict[str, float] | None = None,
    ) -> None:
        if layers_per_group < 1:
            raise ValueError(f"layers_per_group must be >= 1, got {layers_per_group}")
        self.inner = inner
        self.name = f"kv-check({getattr(inner, 'name', type(inner).__name__)})"
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype
        self.model_seed = model_seed
        self.layers_per_group = layers_per_group
        self.poison_enabled = poison
        self.tol = dict(tol) if tol is not None else tolerance(dtype)
        self.stats = OracleStats()
        self.model: TinyTransformer | None = None

    @property
    def version(self) -> str:
        return f"{self.inner.version} + kvspec KV-content oracle"

    def observe(self) -> Observation:
        return self.inner.observe()

    # -- reset --

    def reset(self, config: KVCacheConfig) -> None:
        """Reset the inner target, then build the model and a NaN-filled paged cache for ``config``."""
        self.inner.reset(config)
        decoder = [g for g, spec in enumerate(config.groups) if spec.kind != "cross"]
        if not decoder:
            raise Unsupported("kv-check: every KV-cache group is cross-attention; the oracle models decoder layers")
        layers = tuple(
            LayerSpec(config.groups[g].kind, _window(config.groups[g]), g)
            for _ in range(self.layers_per_group)
            for g in decoder
        )
        if len(layers) < 2:  # the model needs two layers so that KV depends on the prefix
            layers = layers * 2
        mc = ModelConfig(vocab_size=VOCAB, layers=layers, seed=self.model_seed)
        self.model = TinyTransformer(mc, device=self.device)
        self.config = config
        self.block_sizes = [g.block_size for g in config.groups]
        self.cache = self.model.new_cache(config.num_blocks, self.block_sizes, self.dtype)
        self.written: set[int] = set()  # blocks holding anything but NaN
        self.reqs: dict[str, _Req] = {}
        self.loras: dict[tuple[str, str], int] = {}
        self.op_index = -1
        self.obs: Observation | None = None
        self._refresh()

    # -- apply --

    def apply(self, op: O.Op) -> Any:
        if self.model is None:
            raise ValueError("KVCheckTarget.apply called before reset(config)")
        self.op_index += 1
        self.stats.ops += 1
        before = self.obs
        t0 = time.perf_counter()
        out = self.inner.apply(op)
        t1 = time.perf_counter()
        self.stats.inner_seconds += t1 - t0
        self._op = op
        if not isinstance(op, _REQUEST_ONLY) and not isinstance(op, O.TakeEvents):
            self._refresh()
        t2 = time.perf_counter()
        threads = torch.get_num_threads()
        if self.device.type == "cpu" and threads != 1:
            # The model's tensors are tiny: one thread is fastest, and several threads spinning
            # on a loaded machine made each step ~50x slower (measured); restored right after.
            torch.set_num_threads(1)
        try:
            self._after(op, out, before)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            self.stats.oracle_seconds += time.perf_counter() - t2
        return out

    def _refresh(self) -> None:
        t = time.perf_counter()
        self.obs = self.inner.observe()
        self.stats.observe_seconds += time.perf_counter() - t
        self.stats.observations += 1

    def _after(self, op: O.Op, out: Any, before: Observation | None) -> None:
        if isinstance(op, O.AddRequest):
            self.reqs[op.request_id] = _Req(op, self._lora_slot(op.lora))
            return
        if isinstance(op, (O.EvictBlocks, O.ResetPrefixCache)):
            self._poison_released()
            return
        if isinstance(op, O.TakeEvents):
            return
        r = self.reqs.get(op.request_id)
        if r is None:  # the inner target accepted an unknown request: nothing to model
            return
        if isinstance(op, O.AppendOutputTokens):
            r.tokens.extend(op.token_ids)
            r.sched_drafts = ()
        elif isinstance(op, O.SetSpecTokens):
            if not op.token_ids and r.drafts:
                r.sched_drafts = r.drafts
            r.drafts = tuple(op.token_ids)
        elif isinstance(op, O.SetNumComputedTokens):
            self._set_num_computed_tokens(r, op.num_computed_tokens)
        elif isinstance(op, O.GetComputedBlocks):
            r.lookup = [list(g) for g in out["block_ids"]] if isinstance(out, dict) else None
        elif isinstance(op, O.AllocateSlots):
            self._allocate_slots(r, op, out, before)
        elif isinstance(op, O.Free):
            r.alloc, r.pending_hit, r.pending_ext, r.lookup = None, [], None, None
            self._poison_released()
        elif isinstance(op, O.CacheBlocks):
            self._arrive(r, op.num_computed_tokens)
        elif isinstance(op, O.RemoveSkippedBlocks):
            self._poison_released()

    # -- scheduler-side events --

    def _lora_slot(self, lora: tuple[str, str] | None) -> int:
        if lora is None:
            return 0
        return 1 + self.loras.setdefault(lora, len(self.loras)) % LORA_SLOTS

    def _allocate_slots(self, r: _Req, op: O.AllocateSlots, out: Any, before: Observation | None) -> None:
        """Poison the blocks this allocation added that are not the request's prefix hits."""
        if out is not None:
            assert self.obs is not None
            hits = r.lookup if (op.use_computed_blocks and r.lookup is not None) else []
            fresh: set[int] = set()
            for g, table in enumerate(self.obs.tables):
                old = set(before.tables[g].get(r.rid, ())) if before is not None else set()
                keep = old | (set(hits[g]) if g < len(hits) else set()) | {0}
                fresh.update(b for b in table.get(r.rid, ()) if b not in keep)
            if isinstance(out, dict):
                for g, ids in enumerate(out.get("block_ids", ())):
                    fresh.update(b for b in ids if b != 0 and not (g < len(hits) and b in hits[g]))
            self._poison(fresh)
            r.alloc = _Alloc(
                r.computed, op.num_new_computed_tokens, op.num_external_computed_tokens, op.delay_cache_blocks
            )
            if op.use_computed_blocks:
                r.lookup = None
        self._poison_released()  # allocate_slots frees out-of-window blocks first

    def _set_num_computed_tokens(self, r: _Req, n: int) -> None:
        prev, r.computed = r.computed, n
        if n < prev:  # rejection, preemption, failed load: positions >= n are recomputed later
            r.pending_hit = [(a, min(b, n)) for a, b in r.pending_hit if a < n]
            if r.pending_ext is not None:
                a, b = r.pending_ext
                r.pending_ext = (a, min(b, n)) if a < n else None
            r.alloc = None
            return
        if n == prev:
            return
        model_start = prev
        a = r.alloc
        if a is not None:
            hit_end = a.start + a.hit
            ext_end = hit_end + a.ext
            hs, he = max(prev, a.start), min(n, hit_end)
            if he > hs:
                r.pending_hit.append((hs, he))
            es, ee = max(prev, hit_end), min(n, ext_end)
            if ee > es:
                if a.delay:
                    lo = es if r.pending_ext is None else min(es, r.pending_ext[0])
                    hi = ee if r.pending_ext is None else max(ee, r.pending_ext[1])
                    r.pending_ext = (lo, hi)
                else:
                    self._load_external(r, es, ee)
            model_start = max(prev, ext_end)
        if n > model_start:
            self._model_run(r, model_start, n)

    def _arrive(self, r: _Req, upto: int) -> None:
        """``cache_blocks`` after an async load: the connector has written ``[a, min(b, upto))``."""
        if r.pending_ext is None:
            return
        a, b = r.pending_ext
        end = min(b, upto)
        if end > a:
            self._load_external(r, a, end)
        r.pending_ext = (end, b) if end < b else None

    # -- KV writes, reads and checks --

    def _virtual(self, r: _Req, raw: Sequence[int]) -> tuple[int, ...]:
        """Model token ids: LoRA shifts the embedding range, multimodal positions use the item's."""
        base = BASE_VOCAB * r.lora_slot
        out = [base + t % BASE_VOCAB for t in raw]
        for ident, off, length in r.mm:
            h = zlib.crc32(ident.encode())
            for p in range(off, min(off + length, len(out))):
                out[p] = MM_BASE + (h + p - off) % BASE_VOCAB
        return tuple(out)

    def _dense(self, r: _Req, n: int) -> DenseRun:
        seq = self._virtual(r, r.sequence(n))
        d = r.dense
        if d is None or len(d.tokens) < n or d.tokens[:n] != seq:
            assert self.model is not None
            d = r.dense = dense_reference(self.model, seq)
        return d

    def _tables(self, r: _Req) -> list[tuple[int, ...]]:
        assert self.obs is not None
        return [t.get(r.rid, ()) for t in self.obs.tables]

    def _layers(self) -> Iterable[tuple[int, LayerSpec]]:
        assert self.model is not None
        return enumerate(self.model.config.layers)

    def _check_mapped(
        self, r: _Req, tables: list[tuple[int, ...]], lo: int, hi: int, what: str, allow_null: bool = False
    ) -> None:
        """Every position in ``[lo, hi)`` must lie inside the request's table in every decoder group,
        on a block id of the pool, and (unless ``allow_null``) not on the null block."""
        nb = self.config.num_blocks
        for _, spec in self._layers():
            g = spec.group
            bs = self.block_sizes[g]
            table = tables[g]
            bad = [
                p for p in range(lo, hi) if p // bs >= len(table) or not (0 if allow_null else 1) <= table[p // bs] < nb
            ]
            if bad:
                blocks = sorted({table[p // bs] for p in bad if p // bs < len(table)})
                self._raise(
                    "unmapped-slot",
                    r,
                    bad,
                    g,
                    None,
                    blocks,
                    math.inf,
                    math.inf,
                    f"request {r.rid}: {what} positions {_fmt_positions(bad)} have no usable block in group {g} "
                    f"(table {list(table)}, block size {bs})",
                )

    def _load_external(self, r: _Req, a: int, b: int) -> None:
        """The KV connector writes the dense KV of positions ``[a, b)`` into the request's blocks
        (skipping out-of-window positions the manager mapped to the null block)."""
        tables = self._tables(r)
        self._check_mapped(r, tables, a, b, "externally loaded", allow_null=True)
        d = self._dense(r, b)
        for layer, spec in self._layers():
            g, bs = spec.group, self.block_sizes[spec.group]
            table = tables[g]
            pos = [p for p in range(a, b) if table[p // bs] != 0]
            if not pos:
                continue
            t = torch.as_tensor(table, dtype=torch.long, device=self.device)  # [n_blocks]
            pt = torch.as_tensor(pos, dtype=torch.long, device=self.device)  # [P]
            self.cache.write(layer, t, pt, d.k[layer][pt], d.v[layer][pt])
            self.written.update(table[p // bs] for p in pos)
        self.stats.external_tokens_written += b - a

    def _read_kv(self, layer: int, table: Sequence[int], pos: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V [P, Hkv, D] stored for token positions ``pos`` through ``table``."""
        bs = self.cache.block_sizes[layer]
        t = torch.as_tensor(table, dtype=torch.long, device=self.device)  # [n_blocks]
        slots = slot_mapping(t, torch.as_tensor(pos, dtype=torch.long, device=self.device), bs)  # [P]
        kc = self.cache.k[layer].view(-1, *self.cache.k[layer].shape[2:])  # [num_blocks * bs, Hkv, D]
        vc = self.cache.v[layer].view(-1, *self.cache.v[layer].shape[2:])  # [num_blocks * bs, Hkv, D]
        return kc[slots], vc[slots]

    def _compare_kv(
        self, r: _Req, tables: list[tuple[int, ...]], d: DenseRun, lo_of: Any, hi: int
    ) -> tuple[list[BadKV], float, float]:
        """Compare stored K/V with the dense K/V, per layer, for positions ``[lo_of(spec), hi)``
        (null-block positions excluded when ``lo_of`` says so). Returns bad slots and max errors."""
        bad_kv: list[BadKV] = []
        max_abs = max_rel = 0.0
        for layer, spec in self._layers():
            g, bs = spec.group, self.block_sizes[spec.group]
            table = tables[g]
            pos = lo_of(spec, table, bs)
            pos = [p for p in pos if p < hi]
            if not pos:
                continue
            k, v = self._read_kv(layer, table, pos)
            pt = torch.as_tensor(pos, dtype=torch.long, device=self.device)  # [P]
            bk, nk, ak, rk = _errors(k, d.k[layer][pt], self.tol)
            bv, nv, av, rv = _errors(v, d.v[layer][pt], self.tol)
            max_abs, max_rel = max(max_abs, ak, av), max(max_rel, rk, rv)
            bad = (bk | bv).tolist()
            nan = (nk | nv).tolist()
            per_block: dict[int, BadKV] = {}
            for p, is_bad, is_nan in zip(pos, bad, nan):
                if is_bad:
                    b = table[p // bs]
                    entry = per_block.setdefault(b, BadKV(layer, g, b, [], True))
                    entry.positions.append(p)
                    entry.nan = entry.nan and is_nan
            bad_kv.extend(per_block.values())
        return bad_kv, max_abs, max_rel

    def _verify_hits(self, r: _Req, tables: list[tuple[int, ...]], d: DenseRun) -> None:
        """Prefix-hit positions must hold the dense KV of this request's own prefix."""
        ranges, r.pending_hit = r.pending_hit, []
        for a, b in ranges:
            self._check_mapped(r, tables, a, b, "prefix-hit", allow_null=True)

            def hit_positions(spec: LayerSpec, table: Sequence[int], bs: int, a: int = a, b: int = b) -> list[int]:
                return [p for p in range(a, b) if table[p // bs] != 0]

            bad_kv, max_abs, max_rel = self._compare_kv(r, tables, d, hit_positions, b)
            self.stats.hit_tokens_checked += b - a
            if bad_kv:
                first = min(bad_kv, key=lambda x: x.layer)
                positions = sorted({p for x in bad_kv for p in x.positions})
                blocks = sorted({x.block_id for x in bad_kv})
                nan = all(x.nan for x in bad_kv)
                self._raise(
                    "prefix-hit",
                    r,
                    positions,
                    first.group,
                    first.layer,
                    blocks,
                    max_abs,
                    max_rel,
                    f"request {r.rid}: prefix-cache hit positions {_fmt_positions(positions)} in block(s) "
                    f"{blocks} do not hold the KV of {r.rid}'s own prefix ("
                    + (
                        "NaN: the blocks were never written or were freed"
                        if nan
                        else f"largest error {max_abs:.3g}: another sequence's KV"
                    )
                    + f"; first at layer {first.layer}, group {first.group})",
                    bad_kv,
                )

    def _model_run(self, r: _Req, s: int, n: int) -> None:
        """The model computes positions ``[s, n)`` of ``r`` through its block tables."""
        assert self.model is not None
        tables = self._tables(r)
        self._check_ids(r, tables)
        self._check_mapped(r, tables, s, n, "computed")
        d = self._dense(r, n)
        self._verify_hits(r, tables, d)
        if r.pending_ext is not None:  # the load must have arrived before the request runs again
            a, b = r.pending_ext
            r.pending_ext = None
            self._load_external(r, a, min(b, n))
        seq = d.tokens[s:n]
        out = self.model.forward_chunk(seq, s, [t if t else (0,) for t in tables], self.cache, self.dtype)  # [T, d]
        for _, spec in self._layers():
            bs = self.block_sizes[spec.group]
            self.written.update(tables[spec.group][p // bs] for p in range(s, n))
        self.stats.model_runs += 1
        self.stats.tokens_checked += n - s
        bad, _, max_abs, max_rel = _errors(out, d.hidden[s:n], self.tol)
        if bool(bad.any()):
            self._output_mismatch(
                r, tables, d, s, n, [s + i for i, x in enumerate(bad.tolist()) if x], max_abs, max_rel
            )

    def _check_ids(self, r: _Req, tables: list[tuple[int, ...]]) -> None:
        """Every id in the request's tables must name a block of the pool (0 = null)."""
        nb = self.config.num_blocks
        for _, spec in self._layers():
            g = spec.group
            bad = sorted({b for b in tables[g] if not 0 <= b < nb})
            if bad:
                self._raise(
                    "unmapped-slot",
                    r,
                    [],
                    g,
                    None,
                    bad,
                    math.inf,
                    math.inf,
                    f"request {r.rid}: group {g} table holds block id(s) {bad} outside the pool of {nb}",
                )

    def _output_mismatch(
        self,
        r: _Req,
        tables: list[tuple[int, ...]],
        d: DenseRun,
        s: int,
        n: int,
        positions: list[int],
        max_abs: float,
        max_rel: float,
    ) -> None:
        """Find the first layer whose visible K/V differ from the dense KV, and name its blocks."""

        def visible(spec: LayerSpec, table: Sequence[int], bs: int) -> list[int]:
            return list(range(first_visible_position(s, spec.kind, spec.window), n))

        bad_kv, _, _ = self._compare_kv(r, tables, d, visible, n)
        where = ""
        layer = group = None
        blocks = sorted(
            {tables[g][p // self.block_sizes[g]] for g in {sp.group for _, sp in self._layers()} for p in range(s, n)}
        )
        if bad_kv:
            first_layer = min(x.layer for x in bad_kv)
            bad_kv = [x for x in bad_kv if x.layer == first_layer]
            layer, group = first_layer, bad_kv[0].group
            blocks = sorted({x.block_id for x in bad_kv})
            kv_pos = sorted({p for x in bad_kv for p in x.positions})
            nan = all(x.nan for x in bad_kv)
            null = 0 in blocks
            why = (
                "the null block (a block dropped while still in the window)"
                if null
                else "NaN: freed or never written"
                if nan
                else "another sequence's KV"
            )
            where = (
                f"; layer {layer} (group {group}) reads wrong KV at positions {_fmt_positions(kv_pos)} "
                f"in block(s) {blocks}: {why}"
            )
        err = "NaN" if not math.isfinite(max_abs) else f"{max_abs:.3g}"
        self._raise(
            "attention-output",
            r,
            positions,
            group,
            layer,
            blocks,
            max_abs,
            max_rel,
            f"request {r.rid}: attention over the paged cache differs from dense attention at positions "
            f"{_fmt_positions(positions)} (largest abs error {err}){where}",
            bad_kv,
        )

    # -- poisoning --

    def _poison(self, blocks: Iterable[int]) -> None:
        todo = sorted(b for b in blocks if b in self.written)
        if not todo or not self.poison_enabled:
            return
        self.cache.poison(todo)
        self.written.difference_update(todo)
        self.stats.blocks_poisoned += len(todo)

    def _poison_released(self) -> None:
        """Blocks with no reference and no hash can never be read again: fill them with NaN."""
        obs = self.obs
        assert obs is not None
        secondary = getattr(obs, "secondary_keys", None) or {}
        self._poison(b for b in self.written if obs.ref_cnt[b] <= 0 and obs.block_key[b] is None and b not in secondary)

    def _raise(
        self,
        kind: str,
        r: _Req,
        positions: list[int],
        group: int | None,
        layer: int | None,
        blocks: list[int],
        max_abs: float,
        max_rel: float,
        summary: str,
        bad_kv: list[BadKV] | None = None,
    ) -> None:
        raise KVMismatch(
            KVFinding(
                kind=kind,
                target=getattr(self.inner, "name", type(self.inner).__name__),
                request_id=r.rid,
                op_index=self.op_index,
                op=O.op_to_json(self._op),
                positions=list(positions),
                group=group,
                layer=layer,
                block_ids=list(blocks),
                max_abs_err=max_abs,
                max_rel_err=max_rel,
                summary=summary,
                bad_kv=list(bad_kv or []),
                dtype=str(self.dtype).replace("torch.", ""),
                tolerance=dict(self.tol),
            )
        )


def _window(spec: Any) -> int | None:
    if spec.kind == "sliding_window":
        return int(spec.sliding_window)
    if spec.kind == "chunked_local":
        return int(spec.attention_chunk_size)
    return None
