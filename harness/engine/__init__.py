"""A real vLLM engine at work, checked: ``kvspec engine`` (``--target vllm-engine``).

Two sides, two processes.  The **driver** side (``driver.py``, ``workload.py``) runs in kvspec's own
venv as a driver of the one run loop (``harness.run.fuzzing``): it draws a workload per turn and hands
it to the **engine worker**.  The worker (``worker.py`` and what it uses: ``models.py``, ``kv_oracle.py``,
``dense.py``, ``outputs.py``) runs in the engine venv (``ci/setup --engine``: vLLM's CPU build, or the
normal wheel on a GPU) and holds real ``LLM`` engines on tiny random-weight models, with every check on:
shadow (the spec in lockstep behind the engine's manager, ``harness.vllm_sched``), the KV tensor oracle
(the paged cache read through the model runner's block tables against a dense float64 recomputation)
and the outputs (prefix cache on against off, and against the dense model's own greedy decoding).

The driver side uses ``harness.core``, ``harness.check``, ``harness.drivers``, ``harness.traces`` and
``harness.world`` (the family names) and this folder's pure modules; the worker side also vLLM, torch
and transformers (lazily), ``harness.vllm_sched`` for the shadow, ``harness.targets`` (the release)
and ``harness.mutants`` (``--mutant``).  Nothing here imports ``harness.run``.

Imports: harness, harness.core, harness.check, harness.drivers, harness.traces, harness.world,
harness.targets, harness.vllm_sched, harness.mutants, spec.
"""
