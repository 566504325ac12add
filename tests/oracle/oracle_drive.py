"""Drive a target (usually a ``KVCheckTarget``) through seeded ``tests/impl/opgen.py`` traces."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "impl"))

from opgen import scheduler_trace  # noqa: E402

from harness.oracle import KVFinding, KVMismatch  # noqa: E402
from harness.targets.base import Unsupported  # noqa: E402
from spec.config import KVCacheConfig  # noqa: E402


@dataclass
class TraceResult:
    ops: int  # operations applied (including the one that failed)
    finding: KVFinding | None  # the oracle's finding, if any
    stopped: str | None  # why the trace ended early without a KV finding (inner target raised)


def run_trace(target: Any, config: KVCacheConfig, seed: int, steps: int) -> TraceResult:
    """Reset ``target`` and apply one opgen trace; stop at the first ``KVMismatch`` or error."""
    target.reset(config)
    n = 0
    for op, feed in scheduler_trace(config, seed, steps):
        n += 1
        try:
            out = target.apply(op)
        except KVMismatch as e:
            return TraceResult(n, e.finding, None)
        except Unsupported as e:
            return TraceResult(n, None, f"unsupported: {e}")
        except Exception as e:  # noqa: BLE001 - a mutant's allocator may break; not a KV finding
            return TraceResult(n, None, f"{type(e).__name__}: {e}")
        feed(out)
    return TraceResult(n, None, None)


# --- the harness' scheduler model (harness/scheduler.py), driven by a seeded RNG ----------------

ALPHABET = (1, 2, 3)  # as harness.machine: identical blocks under different prefixes are common


class SeededChoices:
    """``harness.scheduler.Choices`` from a ``random.Random`` (the machine uses Hypothesis draws)."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        if hi <= lo:
            return lo
        if boundary and self.rng.random() < 0.5:
            near = [x for k in range(hi // boundary + 2) for x in (k * boundary - 1, k * boundary, k * boundary + 1)]
            near = [x for x in near if lo <= x <= hi]
            if near:
                return self.rng.choice(near)
        return self.rng.randint(lo, hi)

    def boolean(self, label: str) -> bool:
        return self.rng.random() < 0.5

    def token(self, label: str) -> int:
        return self.rng.choice(ALPHABET)


def run_sched_trace(
    target: Any, config: KVCacheConfig, seed: int, rules: int, load_failures: bool = True
) -> TraceResult:
    """Reset ``target`` and run ``rules`` random scheduler actions (the machine's rules: arrivals,
    engine steps, finishes, aborts, KV arrivals, prefix-cache resets) against it alone.
    ``load_failures=False`` keeps every KV load successful (sync and async)."""
    import random

    from harness import ops as O
    from harness.scheduler import SchedConfig, Scheduler

    rng = random.Random(seed)
    ch = SeededChoices(rng)
    bs = config.scheduler_block_size
    k = rng.choice([0, 0, 1, 2, 3])
    sc = SchedConfig(
        token_budget=ch.integer(1, 4 * bs + 1, "budget", bs),
        max_num_seqs=rng.randint(1, 4),
        max_model_len=config.max_model_len,
        block_size=bs,
        num_spec_tokens=k,
        num_lookahead_tokens=rng.choice([0, k]) if k else 0,
        connector=rng.random() < 0.5,
        single_group=len(config.groups) == 1,
    )
    count = [0]

    def emit(op: Any) -> Any:
        count[0] += 1
        return target.apply(op)

    target.reset(config)
    table = (lambda rid: target.observe().tables[0].get(rid, ())) if load_failures else None
    sched = Scheduler(sc, emit, ch, table)
    prefixes = [
        tuple(rng.choice(ALPHABET) for _ in range(ch.integer(1, max(1, config.max_model_len - 2), "p", bs)))
        for _ in range(rng.randint(1, 3))
    ]
    prompts: list[tuple[int, ...]] = []
    try:
        for _ in range(rules):
            roll = rng.random()
            if roll < 0.2 and len(sched.reqs) < 6:
                limit = rng.randint(config.max_model_len // 2, config.max_model_len - 1)
                if prompts and rng.random() < 0.2:
                    prompt = rng.choice(prompts)
                else:
                    prefix = rng.choice(prefixes)[:limit]
                    n = ch.integer(0, max(0, limit - len(prefix)), "suffix", bs)
                    prompt = prefix + tuple(rng.choice(ALPHABET) for _ in range(n))
                prompt = prompt[:limit] or (ALPHABET[0],)
                prompts.append(prompt)
                f = rng.randint(0, 7)
                extra: dict[str, Any] = {}
                if f == 1:
                    extra["lora"] = rng.choice([("sql", "/loras/sql"), ("chat", "/loras/chat")])
                elif f == 2:
                    extra["cache_salt"] = rng.choice(["tenant-a", "tenant-b"])
                elif f == 3 and len(prompt) >= 2:
                    off = rng.randint(0, len(prompt) - 1)
                    extra["mm_features"] = (
                        O.MMFeatureSpec(rng.choice(["img-a", "img-b"]), off, rng.randint(1, len(prompt) - off)),
                    )
                elif f == 4:
                    extra["skip_reading_prefix_cache"] = True
                sched.add_request(O.AddRequest(sched.new_request_id(), prompt, **extra))
            elif roll < 0.75 and not sched.idle():
                sched.step()
            elif roll < 0.82 and sched.running:
                sched.finish(rng.choice(sched.running))
            elif roll < 0.85 and sched.reqs:
                sched.abort(rng.choice(sorted(sched.reqs)))
            elif roll < 0.95 and sched.loading():
                rid = rng.choice(sched.loading())
                r = sched.reqs.get(rid)
                ok, valid = True, 0
                if r is not None and load_failures and rng.random() < 0.25:
                    ok = False
                    if sc.single_group and rng.random() < 0.5:
                        valid = min(r.num_computed, bs * rng.randint(0, max(0, -(-r.num_computed // bs) - 1)))
                sched.kv_arrives(rid, ok, valid)
            elif roll < 0.97:
                emit(O.ResetPrefixCache())
            if config.enable_kv_cache_events:
                emit(O.TakeEvents())
    except KVMismatch as e:
        return TraceResult(count[0], e.finding, None)
    except Unsupported as e:
        return TraceResult(count[0], None, f"unsupported: {e}")
    except Exception as e:  # noqa: BLE001 - a mutant's allocator may break; not a KV finding
        return TraceResult(count[0], None, f"{type(e).__name__}: {e}")
    return TraceResult(count[0], None, None)
