"""A worked example of a user target: a deliberately simple KV-cache manager and its adapter.

``TinyManager`` is what a user might write first: full attention only, no prefix caching, one
free list.  ``TinyTarget`` adapts it to kvspec's protocol (``harness.targets.base.Target``):
``reset`` / ``apply`` / ``observe``.  Having no prefix cache, it declines configs with caching on
(``Unsupported``): there ``observe()`` would have to report each request's block hashes, which
the invariants check.  Fuzz it from the repository root with (docs/targets.md)

    kvspec fuzz --target examples.my_manager:make_target --family no_cache --seconds 5

The target declares ``relation = "invariants"`` (harness/run/relation_choice.py): this manager
legitimately differs from vLLM (its free list is ordered differently), so kvspec checks the
invariants and the KV ledger on its observed state, and says so in the run's first lines.  With
``--relation exact`` kvspec reports the first difference from vLLM 0.33's behaviour instead.
"""

from __future__ import annotations

from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.targets.base import Unsupported
from kvspec.spec.config import KVCacheConfig


class TinyManager:
    """Block 0 is reserved as the null block; blocks 1..N-1 are handed out from the front of a list."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.free_list = list(range(1, num_blocks))
        self.ref_cnt = [0] * num_blocks
        self.tables: dict[str, list[int]] = {}

    def allocate(self, request_id: str, num_tokens_needed: int) -> list[int] | None:
        table = self.tables.setdefault(request_id, [])
        want = -(-min(num_tokens_needed, self.max_model_len) // self.block_size) - len(table)
        if want > len(self.free_list):
            return None
        new = [self.free_list.pop(0) for _ in range(max(0, want))]
        for b in new:
            self.ref_cnt[b] = 1
        table.extend(new)
        return new

    def free(self, request_id: str) -> None:
        for b in reversed(self.tables.pop(request_id, [])):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_list.insert(0, b)


class TinyTarget:
    """The adapter: translate kvspec operations into TinyManager calls, and report its state."""

    name = "my_manager"
    version = "tiny 1.0"
    relation = "invariants"  # the relation that fits (docs/targets.md); --relation still wins
    relation_reason = "TinyManager puts freed blocks at the front of its free list, vLLM at the tail"

    def reset(self, config: KVCacheConfig) -> None:
        if len(config.groups) != 1 or config.groups[0].kind != "full":
            raise Unsupported("TinyManager models one full-attention group only")
        if config.enable_caching:
            # With prefix caching on, a manager must report each request's block hashes (the
            # invariants check them, §9.12); TinyManager has no prefix cache, so it says so.
            raise Unsupported("TinyManager has no prefix cache (enable_caching=False only)")
        self.manager = TinyManager(config.num_blocks, config.groups[0].block_size, config.max_model_len)
        self.num_groups = 1
        self.computed: dict[str, int] = {}

    def apply(self, op: O.Op) -> Any:
        m = self.manager
        if isinstance(op, O.AddRequest):
            self.computed[op.request_id] = 0
        elif isinstance(op, O.SetNumComputedTokens):
            self.computed[op.request_id] = op.num_computed_tokens
        elif isinstance(op, O.GetComputedBlocks):
            return {"block_ids": [[]], "num_hit_tokens": 0}  # no prefix caching
        elif isinstance(op, O.AllocateSlots):
            total = self.computed.get(op.request_id, 0) + op.num_new_computed_tokens + op.num_external_computed_tokens
            new = m.allocate(op.request_id, total + op.num_new_tokens + op.num_lookahead_tokens)
            return None if new is None else {"block_ids": [new]}
        elif isinstance(op, O.Free):
            m.free(op.request_id)
        elif isinstance(op, O.ResetPrefixCache):
            return len(m.free_list) == len(m.ref_cnt) - 1  # nothing cached; "succeeds" when idle
        elif isinstance(op, O.TakeEvents):
            return []
        # AppendOutputTokens, SetSpecTokens, SetStatus, CacheBlocks, RemoveSkippedBlocks and
        # EvictBlocks change nothing in a manager without prefix caching or windows.
        return None

    def observe(self) -> Observation:
        m = self.manager
        return Observation(
            tables=({r: tuple(t) for r, t in m.tables.items()},),
            num_cached_block=({},),
            ref_cnt=tuple(m.ref_cnt),
            free_queue=tuple(m.free_list),
            block_key=(None,) * len(m.ref_cnt),
            cached={},
            request_block_hashes={r: () for r in self.computed},  # caching off: no hashes
        )


def make_target() -> TinyTarget:
    return TinyTarget()
