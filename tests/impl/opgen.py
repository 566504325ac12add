"""A seeded random scheduler that emits ``harness.ops`` traces for differential smoke tests.

It plays roughly what vLLM 0.33's scheduler does (admit with a prefix lookup, chunked prefill,
decode with drafts and rejections, preemption, P/D external loads with delayed caching) and mixes
in raw manager calls (``evict_blocks``, ``reset_prefix_cache``, ``remove_skipped_blocks``,
``cache_blocks``).  The generator only decides the next operation from the outcomes the driver
feeds back, so every target sees exactly the same trace.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from harness.ops import (
    AddRequest,
    AllocateSlots,
    AppendOutputTokens,
    CacheBlocks,
    EvictBlocks,
    Free,
    GetComputedBlocks,
    MMFeatureSpec,
    Op,
    RemoveSkippedBlocks,
    ResetPrefixCache,
    SetNumComputedTokens,
    SetSpecTokens,
    SetStatus,
    TakeEvents,
)
from spec.config import KVCacheConfig


class _R:
    def __init__(self, rid: str, n: int) -> None:
        self.rid, self.num_tokens, self.computed, self.held, self.status = rid, n, 0, False, "WAITING"
        self.drafts = 0


def scheduler_trace(config: KVCacheConfig, seed: int, steps: int) -> Iterator[tuple[Op, Callable[[Any], None]]]:
    """Yield ``(op, feed)`` pairs; the driver calls ``feed(outcome)`` after applying ``op``."""
    rng = random.Random(seed)
    bs = config.scheduler_block_size
    prefixes = [tuple(rng.randrange(50) for _ in range(rng.choice([bs, 2 * bs, 3 * bs + 1]))) for _ in range(3)]
    reqs: list[_R] = []
    outcome: list[Any] = [None]
    cross = any(g.kind == "cross" for g in config.groups)

    def feed(x: Any) -> None:
        outcome[0] = x

    n_req = 0
    for _ in range(steps):
        roll = rng.random()
        waiting = [r for r in reqs if not r.held]
        running = [r for r in reqs if r.held]
        if roll < 0.15 or not reqs:
            n_req += 1
            prompt = rng.choice(prefixes) + tuple(rng.randrange(50) for _ in range(rng.randrange(1, 3 * bs)))
            prompt = prompt[: config.max_model_len - 8]
            r = _R(f"r{n_req}", len(prompt))
            reqs.append(r)
            extra: dict[str, Any] = {}
            if rng.random() < 0.15:
                extra["lora"] = (rng.choice(["a", "b"]), "/p")
            if rng.random() < 0.1:
                extra["cache_salt"] = rng.choice(["s", "t"])
            if rng.random() < 0.1 and len(prompt) > 6:
                off = rng.randrange(len(prompt) - 4)
                ident = rng.choice(["img1", "img2"])  # the content hash fixes the placeholder length
                extra["mm_features"] = (MMFeatureSpec(ident, off, {"img1": 2, "img2": 4}[ident]),)
            if rng.random() < 0.05:
                extra["skip_reading_prefix_cache"] = True
            yield AddRequest(r.rid, prompt, **extra), feed
        elif roll < 0.40 and waiting:
            r = rng.choice(waiting)
            yield GetComputedBlocks(r.rid), feed
            hit = outcome[0]["num_hit_tokens"]
            remaining = r.num_tokens - hit
            ext = 0
            delay = False
            if rng.random() < 0.15 and remaining > 1:
                ext = rng.randrange(1, remaining)
                delay = rng.random() < 0.5
            chunk = 0 if delay else max(1, min(remaining - ext, rng.choice([remaining - ext, bs, 3])))
            op = AllocateSlots(
                r.rid,
                chunk,
                num_new_computed_tokens=hit,
                use_computed_blocks=True,
                num_lookahead_tokens=rng.choice([0, 0, 0, 2]),
                num_external_computed_tokens=ext,
                delay_cache_blocks=delay,
                num_encoder_tokens=rng.choice([0, 5, 17]) if cross else 0,
                full_sequence_must_fit=rng.random() < 0.2,
                reserved_blocks=rng.choice([0, 0, 0, 1, 3]),
            )
            if chunk == 0 and ext == 0 and hit == 0:
                continue
            yield op, feed
            if outcome[0] is not None:
                r.held = True
                r.computed = hit + ext + chunk
                r.status = "WAITING_FOR_REMOTE_KVS" if delay else "RUNNING"
                yield SetStatus(r.rid, r.status), feed
                yield SetNumComputedTokens(r.rid, r.computed), feed
                if delay and rng.random() < 0.7:
                    yield CacheBlocks(r.rid, r.computed), feed
                    r.status = "RUNNING"
                    yield SetStatus(r.rid, r.status), feed
        elif roll < 0.75 and running:
            r = rng.choice(running)
            decoding = r.computed >= r.num_tokens
            if decoding:
                k = rng.randrange(1, 3)
                yield AppendOutputTokens(r.rid, tuple(rng.randrange(50) for _ in range(k))), feed
                r.num_tokens += k
            drafts = rng.choice([0, 0, 2]) if decoding else 0
            yield SetSpecTokens(r.rid, tuple(range(drafts))), feed
            num_new = r.num_tokens - r.computed + drafts
            num_new = max(1, min(num_new, config.max_model_len - r.computed - 1))
            if r.computed + num_new >= config.max_model_len:
                yield Free(r.rid), feed
                reqs.remove(r)
                continue
            yield AllocateSlots(r.rid, num_new, num_lookahead_tokens=rng.choice([0, 0, 1])), feed
            if outcome[0] is None:
                yield Free(r.rid), feed  # preempt
                r.held, r.computed, r.status = False, 0, "PREEMPTED"
                yield SetStatus(r.rid, "PREEMPTED"), feed
                yield SetNumComputedTokens(r.rid, 0), feed
            else:
                rejected = rng.randrange(drafts + 1) if drafts else 0
                r.computed += num_new - rejected
                if drafts - rejected > 0:  # accepted drafts become output tokens (vLLM update_from_output)
                    yield AppendOutputTokens(r.rid, tuple(range(drafts - rejected))), feed
                    r.num_tokens += drafts - rejected
                yield SetNumComputedTokens(r.rid, r.computed), feed
        elif roll < 0.85 and running:
            r = rng.choice(running)
            yield Free(r.rid), feed
            reqs.remove(r)
        elif roll < 0.89 and running:
            r = rng.choice(running)
            yield RemoveSkippedBlocks(r.rid, r.computed), feed
        elif roll < 0.92 and running:
            r = rng.choice(running)
            yield CacheBlocks(r.rid, min(r.computed, r.num_tokens)), feed
        elif roll < 0.95:
            yield EvictBlocks(tuple(rng.randrange(1, config.num_blocks) for _ in range(rng.randrange(1, 3)))), feed
        elif roll < 0.97:
            yield ResetPrefixCache(), feed
        else:
            yield TakeEvents(), feed
