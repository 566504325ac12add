"""Deliberate bugs: targets with one small, realistic mistake each, that kvspec must catch.

- ``registry``: the spec mutants (``--target mutant:NAME``) and the resolution of built-in target names;
- ``invariants``: spec mutants aimed at one invariant each;
- ``impl``: bugs in kvspec's own allocator (for the KV-content oracle);
- ``vllm``: runtime bugs in the installed vLLM's ``KVCacheManager``;
- ``fixes_vllm``: the proposed fixes of the known vLLM bugs (``--target vllm-fixed``).

Imports: harness.core, harness.targets, spec, impl.
"""
