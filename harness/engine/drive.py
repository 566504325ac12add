"""One workload on one engine: requests added at their arrival step, aborted after theirs, the engine
stepped until every request is done (``LLMEngine.add_request`` / ``abort_request`` / ``step``).  Used
by the engine worker (every check hooked into the engine's step) and by ``plugin_run`` (a plain
engine, for the record/shadow plugin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvspec.harness.engine.models import BLOCK_SIZE, MAX_MODEL_LEN
from kvspec.harness.engine.outputs import Counts, EngineFinding
from kvspec.harness.engine.workload import EngineWorkload

MAX_ENGINE_STEPS = 4000


def make_llm(
    folder: Path, pool_bytes: int, caching: bool = True, dtype: str = "float32", engine_defaults: bool = False
) -> Any:
    """An ``LLM`` on the tiny model in ``folder`` as every engine here is built: token prompts only,
    blocks of ``BLOCK_SIZE``, eager, ``pool_bytes`` of KV cache, and dense retention of
    sliding-window blocks (what kvspec models) unless ``engine_defaults``."""
    import vllm

    retention: dict[str, Any] = {} if engine_defaults else {"prefix_cache_retention_interval": None}
    llm: Any = vllm.LLM
    return llm(
        model=str(folder),
        skip_tokenizer_init=True,
        enable_prefix_caching=caching,
        block_size=BLOCK_SIZE,
        enforce_eager=True,
        dtype=dtype,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=pool_bytes,
        seed=0,
        **retention,
    )


def drive(engine: Any, workload: EngineWorkload, counts: Counts) -> dict[int, Any]:
    """``workload`` on ``engine`` (an ``LLMEngine``): request index -> its completions' token ids and
    prompt logprobs, or None when it was aborted."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    pending = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrive_step)
    ids = {i: f"w{workload.seed % 100000}-{i}" for i in range(len(workload.requests))}
    index = {v: k for k, v in ids.items()}
    results: dict[int, Any] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and not engine.has_unfinished_requests():
            # An idle engine steps to nothing (and a multi-process one blocks waiting for output):
            # the next arrival comes now.
            step = max(step, workload.requests[pending[0]].arrive_step)
        while pending and workload.requests[pending[0]].arrive_step <= step:
            i = pending.pop(0)
            r = workload.requests[i]
            params = SamplingParams(
                max_tokens=r.max_tokens,
                n=r.n,
                temperature=0.0 if r.n == 1 else 1.0,
                seed=None if r.n == 1 else workload.seed % (1 << 31),
                ignore_eos=True,
                detokenize=False,
                prompt_logprobs=1 if r.prompt_logprobs else None,
            )
            engine.add_request(ids[i], TokensPrompt(prompt_token_ids=list(r.prompt)), params)
            counts.add(requests=1)
        for i, r in enumerate(workload.requests):
            if r.abort_step == step and i not in results and i not in pending:
                engine.abort_request([ids[i]])
                results[i] = None
                counts.add(aborts=1)
        for out in engine.step():
            if out.finished and out.request_id in index:
                results[index[out.request_id]] = {
                    "outputs": [list(c.token_ids) for c in out.outputs],
                    "prompt_logprobs": _prompt_logprobs(out, workload.requests[index[out.request_id]].prompt),
                }
        step += 1
        if step > MAX_ENGINE_STEPS:
            raise EngineFinding("engine-raised", f"the workload did not finish in {MAX_ENGINE_STEPS} engine steps")
    return results


def _prompt_logprobs(out: Any, prompt: tuple[int, ...]) -> list[float] | None:
    """The logprob the engine gave each prompt token (from position 1), or None when not asked."""
    rows = out.prompt_logprobs
    if rows is None:
        return None
    return [float(rows[i][prompt[i]].logprob) for i in range(1, len(prompt))]
