"""Deliberate bugs in the engine's own path: what the scheduler hands the model runner, and how the
runner writes KV.  Each is a runtime patch of vLLM's CPU build (0.32; the same classes in 0.33/0.34),
applied in the engine worker (``harness.engine.worker --mutant NAME``) for its whole life.

None of them changes a manager call, so the manager-level checks (shadow) cannot see them by
construction; each must be caught by the engine check written for it (``intended``): the runner's
block tables against the manager's, or the KV tensor oracle (tests/engine/test_engine_mutants.py).
A fourth slip the issue names, KV written for a rejected draft, needs speculative decoding in the
engine, which the tiny models here do not run yet: not in the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvspec.harness.mutants.record import Mutant, Patch, by_name
from kvspec.harness.mutants.vllm_scheduler import last_token_changed

SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
BLOCK_TABLE = "vllm.v1.worker.block_table:BlockTable"


def _table_off_by_one(orig: Callable[..., Any]) -> Callable[..., Any]:
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        for new in out.scheduled_new_reqs:  # the last block id a new request's table is handed, one too high
            table = new.block_ids[0]
            if len(table) >= 2 and 0 < table[-1] < self.kv_cache_config.num_blocks - 1:
                table[-1] += 1
        return out

    return schedule


def _resumed_newest_only(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _make_cached_request_data(self: Any, running: Any, resumed: Any, *args: Any, **kwargs: Any) -> Any:
        data = orig(self, running, resumed, *args, **kwargs)
        for i, rid in enumerate(data.req_ids):  # a resumed request handed only its newest block per group
            if rid in data.resumed_req_ids and data.new_block_ids[i] is not None:
                data.new_block_ids[i] = tuple(ids[-1:] for ids in data.new_block_ids[i])
        return data

    return _make_cached_request_data


def _slot_skipped(orig: Callable[..., Any]) -> Callable[..., Any]:
    def compute_slot_mapping(self: Any, num_reqs: int, query_start_loc: Any, positions: Any) -> None:
        orig(self, num_reqs, query_start_loc, positions)
        slots = self.slot_mapping.gpu[: positions.shape[0]]
        skip = (positions == 37) & (slots >= 0)  # position 37's KV written one slot further on
        slots[skip] += 1

    return compute_slot_mapping


def _engine_mutant(name: str, family: str, doc: str, owner: str, attr: str, wrap: Any, intended: str) -> Mutant:
    return Mutant(name, "vllm-engine", doc, family, ("exact",), intended, Patch(owner, attr, wrap))


MUTANTS: dict[str, Mutant] = by_name(
    (
        _engine_mutant(
            "engine_table_off_by_one",
            "block_boundaries",
            "a new request's last block id is handed to the model runner one too high",
            SCHEDULER,
            "schedule",
            _table_off_by_one,
            "engine-table",
        ),
        _engine_mutant(
            "engine_resumed_newest_only",
            "preemption",
            "a request resumed after preemption is handed only its newest block per group",
            SCHEDULER,
            "_make_cached_request_data",
            _resumed_newest_only,
            "engine-table",
        ),
        _engine_mutant(
            "engine_sampled_token_misread",
            "block_boundaries",
            "the scheduler appends a last token the model runner did not sample (vllm_scheduler's slip, in an engine)",
            SCHEDULER,
            "update_from_output",
            last_token_changed,
            "kv-ledger",
        ),
        _engine_mutant(
            "engine_slot_skipped",
            "block_boundaries",
            "the slot mapping skips a position: position 37's KV lands in the next slot",
            BLOCK_TABLE,
            "compute_slot_mapping",
            _slot_skipped,
            "kv-mismatch",
        ),
    )
)


def apply_engine_mutant(name: str) -> None:
    """Patch mutant ``name`` in for the rest of the process (the engine worker's ``--mutant``)."""
    mutant = MUTANTS.get(name)
    if mutant is None:
        raise SystemExit(f"unknown engine mutant {name!r} (known: {', '.join(MUTANTS)})")
    owner = mutant.patch.resolve()
    setattr(owner, mutant.patch.attr, mutant.patch.wrap(owner.__dict__[mutant.patch.attr]))
