"""Engine workloads: kvspec's families turned into token prompts for a real engine.

A workload is data (JSON both ways, validated on the way in): requests with their prompt tokens, how
many tokens to generate, the engine step they arrive at and the one they are aborted after, ``n``
completions (sampled, seeded) or one (greedy), and whether prompt logprobs are asked.  Every family
draws from ``random.Random(f"{family}/{seed}")``, so a family and a seed are the whole workload.
The engines' pools are small (``worker.POOL_BLOCKS``), so that most workloads preempt.

Families (``ENGINE_FAMILIES``):
- ``shared_prefix``: prompts that share documents cut at and around block boundaries, arriving
  over a few steps (prefix hits, including on blocks still being computed);
- ``block_boundaries``: prompt and output lengths at 32k - 1, 32k and 32k + 1 tokens;
- ``preemption``: more and longer requests than the pool holds at once (preemption and resumption);
- ``aborts``: requests aborted while waiting, while prefilling and while decoding;
- ``parallel_sampling``: ``n`` of 2 or 3 seeded samples sharing a prompt's blocks;
- ``prompt_logprobs``: prompt logprobs asked (the engine then skips prefix-cache reads for them).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from kvspec.harness.engine.models import BLOCK_SIZE, MAX_MODEL_LEN, VOCAB

ENGINE_FAMILIES = ("shared_prefix", "block_boundaries", "preemption", "aborts", "parallel_sampling", "prompt_logprobs")
MAX_REQUESTS = 64


@dataclass(frozen=True)
class EngineRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    arrive_step: int = 0
    abort_step: int | None = None
    n: int = 1
    prompt_logprobs: bool = False


@dataclass(frozen=True)
class EngineWorkload:
    family: str
    seed: int
    requests: tuple[EngineRequest, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "seed": self.seed,
            "requests": [{**asdict(r), "prompt": list(r.prompt)} for r in self.requests],
        }

    @staticmethod
    def from_json(obj: Any, where: str) -> EngineWorkload:
        """The workload ``obj`` describes, checked (a ``ValueError`` naming the first problem)."""

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"{where}: {what}")

        need(isinstance(obj, dict), "a workload is a JSON object")
        need(obj.get("family") in ENGINE_FAMILIES, f"family must be one of {', '.join(ENGINE_FAMILIES)}")
        seed = obj.get("seed")
        need(type(seed) is int and 0 <= seed < 1 << 64, "seed must be an int in [0, 2**64)")
        reqs: Any = obj.get("requests")
        need(isinstance(reqs, list) and 1 <= len(reqs) <= MAX_REQUESTS, f"requests must be a list of 1..{MAX_REQUESTS}")
        out = []
        for i, r in enumerate(reqs):
            w = f"requests[{i}]"
            need(isinstance(r, dict) and set(r) <= set(EngineRequest.__dataclass_fields__), f"{w}: unknown fields")
            prompt = r.get("prompt")
            need(
                isinstance(prompt, list) and len(prompt) > 0 and all(type(t) is int and 0 <= t < VOCAB for t in prompt),
                f"{w}.prompt must be a non-empty list of token ids in [0, {VOCAB})",
            )
            mt, arrive, abort, n = r.get("max_tokens"), r.get("arrive_step", 0), r.get("abort_step"), r.get("n", 1)
            need(
                type(mt) is int and 1 <= mt and len(prompt) + mt <= MAX_MODEL_LEN,
                f"{w}: max_tokens must be >= 1 and prompt + max_tokens <= {MAX_MODEL_LEN}",
            )
            need(type(arrive) is int and 0 <= arrive <= 1000, f"{w}.arrive_step must be an int in [0, 1000]")
            need(
                abort is None or (type(abort) is int and arrive <= abort <= 1000),
                f"{w}.abort_step must be null or in [arrive_step, 1000]",
            )
            need(type(n) is int and 1 <= n <= 4, f"{w}.n must be an int in [1, 4]")
            need(type(r.get("prompt_logprobs", False)) is bool, f"{w}.prompt_logprobs must be a bool")
            out.append(EngineRequest(tuple(prompt), mt, arrive, abort, n, bool(r.get("prompt_logprobs", False))))
        return EngineWorkload(obj["family"], seed, tuple(out))


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, VOCAB) for _ in range(n))


def _near_boundary(rng: random.Random, lo: int, hi: int) -> int:
    """A length in [lo, hi] at or next to a block boundary."""
    k = rng.randrange(max(1, lo // BLOCK_SIZE), hi // BLOCK_SIZE + 1)
    return min(hi, max(lo, k * BLOCK_SIZE + rng.choice((-1, 0, 1))))


def draw_workload(family: str, seed: int) -> EngineWorkload:
    """The workload of ``family`` at ``seed`` (module docstring)."""
    if family not in ENGINE_FAMILIES:
        raise ValueError(f"unknown engine family {family!r} (known: {', '.join(ENGINE_FAMILIES)})")
    rng = random.Random(f"{family}/{seed}")
    reqs: list[EngineRequest] = []
    if family in ("shared_prefix", "prompt_logprobs", "parallel_sampling", "aborts"):
        docs = [_tokens(rng, rng.randrange(40, 161)) for _ in range(rng.randrange(1, 4))]
        for _ in range(rng.randrange(3, 9)):
            doc = rng.choice(docs)
            cut = min(len(doc), _near_boundary(rng, 1, len(doc)))
            prompt = doc[:cut] + _tokens(rng, rng.randrange(0, 40))
            prompt = prompt or _tokens(rng, 1)
            mt = rng.randrange(1, min(48, MAX_MODEL_LEN - len(prompt)) + 1)
            reqs.append(
                EngineRequest(
                    prompt,
                    mt,
                    arrive_step=rng.choice((0, 0, 1, 2, 4, 8)),
                    n=rng.choice((2, 3)) if family == "parallel_sampling" and rng.random() < 0.6 else 1,
                    prompt_logprobs=family == "prompt_logprobs" and rng.random() < 0.6,
                )
            )
        if family == "aborts":
            reqs = [
                EngineRequest(
                    r.prompt,
                    r.max_tokens,
                    r.arrive_step,
                    r.arrive_step + rng.choice((0, 1, 2, 5, 10)) if rng.random() < 0.5 else None,
                )
                for r in reqs
            ]
    elif family == "block_boundaries":
        for _ in range(rng.randrange(2, 7)):
            plen = _near_boundary(rng, 1, 160)
            mt = max(1, min(MAX_MODEL_LEN - plen, _near_boundary(rng, 1, 64) - (plen % BLOCK_SIZE)))
            reqs.append(EngineRequest(_tokens(rng, plen), mt, arrive_step=rng.choice((0, 0, 3))))
    else:  # preemption
        shared = _tokens(rng, rng.randrange(32, 97))
        for _ in range(rng.randrange(6, 13)):
            prompt = (shared if rng.random() < 0.5 else ()) + _tokens(rng, rng.randrange(20, 120))
            mt = rng.randrange(16, min(96, MAX_MODEL_LEN - len(prompt)) + 1)
            reqs.append(EngineRequest(prompt, mt, arrive_step=rng.choice((0, 0, 0, 2, 6))))
    return EngineWorkload(family, seed, tuple(reqs))
