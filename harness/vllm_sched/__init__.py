"""The installed vLLM's real ``Scheduler`` (0.33.0, 0.34.0) driving its ``KVCacheManager``, the spec mirrored behind it.

- ``build``: the real scheduler on CPU, offline, from a kvspec ``KVCacheConfig`` and scheduler knobs;
- ``proxy``: the manager proxy that turns every manager call (and the request changes before it)
  into ``harness.core.ops`` operations for a lockstep (``LockstepSink``) or a recording;
- ``driver``: the scheduler's inputs only (arrivals, model outputs, drafts, connector loads);
- ``fuzz``: the real-scheduler driver of the one run loop (``kvspec fuzz --target vllm-scheduler``,
  and ``--target mutant:NAME`` of the scheduler mutants, ``harness.mutants.vllm_scheduler``);
- ``record``: ``KVSPEC_RECORD`` / ``KVSPEC_SHADOW`` in a user's vLLM process (a vLLM general plugin);
- ``bench``: the proxy's per-call cost.

docs/vllm-scheduler.md describes the whole.

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, harness.mutants,
harness.check, harness.traces, harness.drivers, spec.
"""
