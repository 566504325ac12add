"""The KV-content oracle: wrapped around any target, it checks the numbers the model would read.

Block ids that agree with the spec do not prove that attention reads the right K and V.  A
``KVCheckTarget`` wraps a target (spec, vLLM 0.33's manager, ``impl``, a user's) and plays the
model runner next to it: for every chunk the scheduler computes it runs a tiny seeded transformer
(``impl.paged.model.TinyTransformer``) through a paged KV cache, writing K/V into the block ids the
target's tables give and attending through them, and compares the result with a dense, cache-free
float64 reference over the request's own tokens.  It never consults the spec, so reuse of a block
still in use, a hash published before its KV was written, a hit on a block with another prefix, or
a window that dropped a block too early show up as wrong numbers on their own.

How the operations of ``harness.core.ops`` map onto the model runner (vLLM 0.33 ``GPUModelRunner`` /
``Scheduler`` semantics; the mapping is ``harness.ledger.schedule``, shared with the KV ledger):

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
- Poisoning with NaN: blocks that an ``AllocateSlots`` adds to a table other than the request's
  prefix hits at their own index (fresh blocks hold garbage; a hit the window passed can come back
  fresh elsewhere), and blocks that reach ``ref_cnt == 0`` without
  a hash (nothing may read them again); hashed free blocks keep their contents (a later hit reads
  them).  A read of a poisoned slot turns the output into NaN, which never passes.
- A decrease of the computed count (spec-decode rejection, preemption) needs nothing: the rolled
  back positions are rewritten before anything reads them.

A mismatch raises ``KVMismatch`` carrying a ``KVFinding``: the request, the token positions, the
group and layer, the block ids holding wrong KV (NaN: freed or never written), the largest error,
and a one-line summary, with ``to_json`` / ``to_markdown`` for the report's "KV contents" section.

The pieces: ``harness.oracle.finding`` (findings and their rendering), ``harness.oracle.dense`` (the dense
reference), ``harness.oracle.paged`` (the model's layers and paged cache for a config, poisoning),
``harness.oracle.runner`` (the model runner: per-request state and the events above); this module is
the ``Target`` wrapper, which feeds the mapping (``harness.ledger.schedule``, whose ``RequestBook`` keeps
the requests).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import RequestBook
from kvspec.harness.core.observation import Observation
from kvspec.harness.ledger.checker import LedgerChecker
from kvspec.harness.ledger.known_bugs import match_known_bug
from kvspec.harness.ledger.request import FILLER, Alloc
from kvspec.harness.ledger.schedule import KVSchedule
from kvspec.harness.oracle.dense import DenseRun, dense_reference, row_errors
from kvspec.harness.oracle.finding import BadKV, KVFinding, KVMismatch, fmt_positions
from kvspec.harness.oracle.paged import PagedKV
from kvspec.harness.oracle.request import BASE_VOCAB, LORA_SLOTS, MM_BASE, VOCAB, OracleRequest
from kvspec.harness.oracle.runner import ModelRunner, OracleStats
from kvspec.harness.targets.base import Target
from kvspec.impl.paged.kv_cache import default_device
from kvspec.impl.paged.model import TinyTransformer, tolerance
from kvspec.spec.config import KVCacheConfig

__all__ = [
    "BASE_VOCAB",
    "FILLER",
    "LORA_SLOTS",
    "MM_BASE",
    "VOCAB",
    "Alloc",
    "BadKV",
    "DenseRun",
    "KVCheckTarget",
    "KVFinding",
    "KVMismatch",
    "ModelRunner",
    "OracleRequest",
    "OracleStats",
    "PagedKV",
    "dense_reference",
    "fmt_positions",
    "row_errors",
]


class KVCheckTarget:
    """A ``Target`` that forwards every operation to ``inner`` and checks KV contents alongside.

    ``apply`` returns the inner outcome unchanged and raises ``KVMismatch`` when the numbers go
    wrong; exceptions of the inner target (``Unsupported`` included) pass through untouched.
    ``poison=False`` turns NaN poisoning off (only for showing that it matters).  ``known_bugs``
    (default True; ``--strict-known`` passes False): a KV ledger runs alongside, and when it recognises
    a known target bug (``harness.ledger.known_bugs``) checking stops for the run instead of reporting the
    wrong numbers it causes (``stats.known_bugs`` counts them, ``stopped`` says where).
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
        known_bugs: bool = True,
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
        self.runner: ModelRunner | None = None
        self.schedule: KVSchedule[OracleRequest] | None = None
        self.op_index = -1  # index of the last operation applied since reset
        self.known_bugs = known_bugs
        self.ledger: LedgerChecker | None = None  # recognises known target bugs (``known_bugs``)
        self.stopped: str | None = None  # why checking stopped for this run (a known bug)

    @property
    def version(self) -> str:
        return f"{self.inner.version} + kvspec KV-content oracle"

    @property
    def book(self) -> RequestBook[OracleRequest]:
        """The requests as the mapping keeps them (``OracleRequest`` natives)."""
        assert self.schedule is not None, "KVCheckTarget.book read before reset(config)"
        return self.schedule.book

    @property
    def model(self) -> TinyTransformer | None:
        return self.runner.kv.model if self.runner is not None else None

    @property
    def obs(self) -> Observation | None:
        """The inner target's state as of the last operation that can change block tables."""
        return self.runner.obs if self.runner is not None else None

    def observe(self) -> Observation:
        return self.inner.observe()

    def reset(self, config: KVCacheConfig) -> None:
        """Reset the inner target, then build the model and a NaN-filled paged cache for ``config``."""
        self.inner.reset(config)
        kv = PagedKV(
            config,
            VOCAB,
            self.device,
            self.dtype,
            self.tol,
            model_seed=self.model_seed,
            layers_per_group=self.layers_per_group,
            poison=self.poison_enabled,
        )
        self.runner = ModelRunner(kv, self.stats, self.inner)
        self.schedule = KVSchedule(self.runner, config)
        self.config = config
        self.op_index = -1
        self.stopped = None
        self._refresh(self.runner)
        self.ledger = LedgerChecker(config) if self.known_bugs else None
        if self.ledger is not None and self.runner.obs is not None:
            self.ledger.start(self.runner.obs)

    def _known_bug(self, op: O.Op, out: Any, before: Observation | None, after: Observation | None) -> bool:
        """The KV ledger, fed the same operation, recognises a known target bug (``harness.ledger.known_bugs``):
        the cache now holds KV that is wrong for a known reason, so checking stops for this run (the
        run's own ledger reports the bug, counted, once).  Any other ledger finding only ends the
        recognising: the numbers stay checked."""
        if self.ledger is None or after is None:
            return False
        f = self.ledger.check(op, out, before, after)
        if f is None:
            return False
        self.ledger = None
        bug = match_known_bug(f.signature)
        if bug is None:
            return False
        self.stats.known_bugs[bug.id] += 1
        self.stopped = f"known bug {bug.id} ({bug.name}) at operation {self.op_index}"
        return True

    def apply(self, op: O.Op) -> Any:
        runner, schedule = self.runner, self.schedule
        if runner is None or schedule is None:
            raise ValueError("KVCheckTarget.apply called before reset(config)")
        if self.stopped is not None:
            return self.inner.apply(op)
        self.op_index += 1
        self.stats.ops += 1
        before = runner.obs
        t0 = time.perf_counter()
        out = self.inner.apply(op)
        t1 = time.perf_counter()
        self.stats.inner_seconds += t1 - t0
        runner.op_index, runner.op = self.op_index, op
        if not isinstance(op, (*O.REQUEST_OPS, O.TakeEvents)):  # those cannot change block tables
            self._refresh(runner)
        if self._known_bug(op, out, before, runner.obs):
            return out
        t2 = time.perf_counter()
        threads = torch.get_num_threads()
        if self.device.type == "cpu" and threads != 1:
            # The model's tensors are tiny: one thread is fastest, and several threads spinning
            # on a loaded machine made each step ~50x slower (measured); restored right after.
            torch.set_num_threads(1)
        try:
            schedule.apply(op, out, before, runner.obs)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            self.stats.oracle_seconds += time.perf_counter() - t2
        return out

    def _refresh(self, runner: ModelRunner) -> None:
        t = time.perf_counter()
        runner.obs = self.inner.observe()
        self.stats.observe_seconds += time.perf_counter() - t
        self.stats.observations += 1
