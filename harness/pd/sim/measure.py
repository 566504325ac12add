"""Measure the decode side's manager calls on the real vLLM 0.33 ``KVCacheManager`` (CPU).

The calls a decode instance makes for one disaggregated request, through the harness' own adapter
(``harness.targets.vllm.VllmTarget``, so the numbers include its thin dispatch): the prefix lookup
(``get_computed_blocks``), the remote-KV allocation (``allocate_slots(r, 0, ext_comp=prompt,
delay_cache_blocks=True)``), publication on arrival (``cache_blocks``) and ``free``, for prompts of
several lengths, on a pool the size of an H200 decode instance's (``inputs.D_BLOCKS``).  Each is
the median over ``repeats`` fresh requests.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.pd.instance import make_config

PROMPT_BLOCKS = (8, 64, 256, 768)
BLOCK_SIZE = 16


def measure_manager_costs(num_blocks: int, repeats: int = 30, progress: Any = None) -> dict[str, Any]:
    """Median seconds per call, keyed by call and prompt length in blocks."""
    from kvspec.harness.targets.vllm import VllmTarget, vllm_version

    target = VllmTarget()
    target.reset(make_config(num_blocks, BLOCK_SIZE, max(PROMPT_BLOCKS) * BLOCK_SIZE + 64))
    out: dict[str, Any] = {"vllm": vllm_version(), "num_blocks": num_blocks, "block_size": BLOCK_SIZE, "median_s": {}}
    n = 0
    for nb in PROMPT_BLOCKS:
        samples: dict[str, list[float]] = {
            "get_computed_blocks": [],
            "allocate_slots": [],
            "cache_blocks": [],
            "free": [],
        }
        for _ in range(repeats):
            rid = f"m{n}"
            n += 1
            prompt = tuple((n * 7919 + j) % 50000 + 1 for j in range(nb * BLOCK_SIZE))  # distinct: no prefix hits
            target.apply(O.AddRequest(rid, prompt))
            calls: list[tuple[str, O.Op]] = [
                ("get_computed_blocks", O.GetComputedBlocks(rid)),
                (
                    "allocate_slots",
                    O.AllocateSlots(
                        rid,
                        0,
                        use_computed_blocks=True,
                        num_external_computed_tokens=len(prompt),
                        delay_cache_blocks=True,
                    ),
                ),
                ("cache_blocks", O.CacheBlocks(rid, len(prompt))),
                ("free", O.Free(rid)),
            ]
            for name, op in calls:
                if name == "cache_blocks":
                    target.apply(O.SetNumComputedTokens(rid, len(prompt)))
                t = time.perf_counter()
                result = target.apply(op)
                samples[name].append(time.perf_counter() - t)
                if name == "allocate_slots" and result is None:
                    raise RuntimeError(f"the pool of {num_blocks} blocks cannot hold a {nb}-block prompt")
        out["median_s"][str(nb)] = {name: statistics.median(v) for name, v in samples.items()}
        if progress is not None:
            progress(f"measured vLLM manager calls for {nb}-block prompts")
    return out


def write_costs(path: Path, costs: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(costs, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_costs(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
