"""Deliberate bugs: targets with one small, realistic mistake each, that kvspec must catch.

- ``record``: ``Mutant``, the one record of every catalogue (name, target kind, the slip, family,
  campaign modes, the check meant to catch it, the ``Patch`` that applies it);
- ``registry``: the resolution of built-in target names (``--target mutant:NAME``, ``vllm-fixed``)
  and ``all_mutants``, every catalogue's records;
- ``spec``: the spec mutants and the spec target carrying one; ``invariants``: spec mutants aimed
  at one invariant each;
- ``impl``: bugs in kvspec's own allocator (for the KV-content oracle and the ledger);
- ``vllm``: runtime bugs in the installed vLLM's ``KVCacheManager``;
- ``vllm_scheduler``: runtime bugs in vLLM's real ``Scheduler`` (run by ``harness.vllm_sched``);
- ``vllm_engine``: bugs in the engine's own path (run in the engine worker);
- ``sglang``: runtime bugs in SGLang's radix cache (the ``sglang`` target, ``harness.sglang``);
- ``fixes_vllm``: the proposed fixes of the known vLLM bugs (``--target vllm-fixed``).

Imports: harness.core, harness.targets, harness.sglang, spec, impl.
"""
