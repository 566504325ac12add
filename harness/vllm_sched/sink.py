"""The proxy's lockstep sink: the spec beside vLLM's real manager, fed every call the real scheduler makes.

``LockstepSink`` is a ``harness.check.lockstep.Lockstep`` whose target is ``PassiveVllmTarget``, which
makes no call of its own: its ``apply`` returns the outcome the real call produced
(``harness.vllm_sched.proxy``) and its ``observe`` is ``VllmTarget.observe`` on the real manager.  The
spec runs beside it; the first divergence, invariant or ledger problem raises ``FindingError`` as in any
lockstep run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvspec.harness.check.lockstep import Lockstep
from kvspec.harness.check.settings import DEFAULT_CHECKS, CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.book import BookRequest
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.vllm import VllmTarget
from kvspec.spec.config import KVCacheConfig


class PassiveVllmTarget(VllmTarget):
    """The real manager as a lockstep target that makes no call itself: ``apply`` returns the
    outcome the real scheduler's call produced (``expect``), ``observe`` reads the real manager."""

    name = "vllm"

    def __init__(self, manager: Any, assume_release: str | None = None) -> None:
        import logging

        # Inside a user's engine: the adapter's probe must not change the engine's own log level.
        vllm_log = logging.getLogger("vllm")
        level = vllm_log.level
        super().__init__(assume_release=assume_release)
        vllm_log.setLevel(level)
        self._real = manager
        self._outcome: Any = None
        self._error: BaseException | None = None
        self._native: Any = None

    def expect(self, outcome: Any, error: BaseException | None, native: Any = None) -> None:
        self._outcome, self._error, self._native = outcome, error, native

    def build(self, config: KVCacheConfig) -> None:
        from vllm.v1.core import kv_cache_utils

        self._manager = self._real
        self._lora_ids = {}
        self._hash_by_low64 = {}
        self._hash_memo = {}
        self._hash_block_size = int(config.hash_block_size)
        # rid -> (hashes kept, the list's length, its last hash, the hashes kept)
        self._memo: dict[str, tuple[int, int, Any, tuple[bytes, ...]]] = {}
        # Read, never written: a real engine may build its scheduler before init_none_hash runs.
        self._none_hash = getattr(kv_cache_utils, "NONE_HASH", b"")

    def _ensure_none_hash(self) -> None:
        """Never: the engine's own ``NONE_HASH`` is the one in force (read only)."""

    def _result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._outcome

    def new_request(self, r: BookRequest) -> Any:
        return self._native

    def update_request(self, request: Any, r: BookRequest, op: O.Op) -> Any:
        return request

    def get_computed_blocks(self, request: Any) -> tuple[Any, list[list[int]], int]:
        out = self._result()
        return None, out["block_ids"], out["num_hit_tokens"]

    def allocate_slots(self, request: Any, op: O.AllocateSlots, new_computed_blocks: Any) -> list[list[int]] | None:
        out = self._result()
        return None if out is None else list(out["block_ids"])

    def free(self, request: Any, request_id: str) -> None:
        self._result()

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self._result()

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        self._result()

    def evict_blocks(self, block_ids: tuple[int, ...]) -> None:
        self._result()

    def reset_prefix_cache(self) -> bool:
        return bool(self._result())

    def observe(self) -> Observation:
        return super().observe()

    def _observed_hashes(self, rid: str, request: Any) -> tuple[bytes, ...]:
        """The request's block hashes as of its last synchronisation: the real scheduler may have
        appended tokens since (they reach the spec at the request's next manager call), and vLLM
        only ever appends hashes, so the first ``num_tokens // hash_block_size`` are those."""
        hashes = request.block_hashes
        if not hashes:
            return ()
        n, size, last = self.book.requests[rid].num_tokens // self._hash_block_size, len(hashes), hashes[-1]
        # Re-read only when the list changed (as ``VllmTarget._observed_hashes``: an unchanged length
        # and an identical last element mean an unchanged list) or the synchronised count moved.
        memo = self._memo.get(rid)
        if memo is not None and memo[0] == n and memo[1] == size and memo[2] is last:
            return memo[3]
        observed = tuple(hashes[:n])
        self._memo[rid] = (n, size, last, observed)
        return observed


FULL_CHECK_EVERY = 1 << 20
"""Operations between full checks within an engine step (never reached: ``LockstepSink.finish`` runs one
at every engine step's end)."""


class LockstepSink:
    """Mirrors every operation into a ``Lockstep`` (spec beside the passive real manager)."""

    def __init__(
        self,
        config: KVCacheConfig,
        manager: Any,
        checks: CheckSettings = DEFAULT_CHECKS,
        assume_release: str | None = None,
    ) -> None:
        self.target = PassiveVllmTarget(manager, assume_release)
        # Glimpses after each operation, the whole state at each engine step's end (``end_of_step``).
        checks = replace(checks, step_timeout=None, full_check_every=FULL_CHECK_EVERY)
        self.lockstep = Lockstep(config, self.target, checks)
        self.lockstep.start()
        self.world: Any = None  # harness.vllm_sched.world_checks.WorldChecks, told each request operation
        self.phase, self.calls = "world", list[tuple[str, O.Op]]()  # manager calls by phase (the agreement)

    @property
    def done(self) -> bool:
        return False

    def request_op(self, op: O.Op, request: Any) -> None:
        self.target.expect(None, None, request)
        self.lockstep.apply(op)
        if self.world is not None:
            self.world.appended(op)

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        self.target.expect(outcome, error)
        self.calls.append((self.phase, op))
        self.lockstep.apply(op)

    def finish(self) -> None:
        """The end of an engine step or of the run: a full check of the whole state if operations
        were glimpsed since the last one (``harness.core.glimpse``)."""
        self.lockstep.finish()

    def observation(self) -> Observation:
        """The real manager's whole state now: the observation the last full check read when nothing
        was glimpsed since (after ``finish``, every engine step's end), else read again."""
        ls = self.lockstep
        if ls.tgt_obs is not None and not ls.tgt_obs_is_spec and ls.since_full == 0:
            return ls.tgt_obs
        return self.target.observe()

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    @property
    def steps(self) -> list[tuple[O.Op, Any]]:
        return self.lockstep.steps
