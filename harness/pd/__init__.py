"""P/D disaggregation with and without pre-allocation on the decode instance (issue 13).

An executable model of a prefill/decode cluster built from the spec manager (one
``spec.kv_cache_manager`` state per instance), the safety rules it must keep, a Hypothesis state
machine that drives it (and, where it applies, one real vLLM 0.33 ``KVCacheManager`` per instance),
and a discrete-event simulation of what pre-allocation buys.  Read in this order:

- ``types``: ids, ticks, and ``Design``, the decisions a protocol makes;
- ``designs``: the baseline (vLLM 0.33 today), the proposal as written, the amended proposal, and
  the deliberate bugs (each one decision flipped);
- ``messages``, ``state``, ``instance`` (manager calls and the KV contents of blocks);
- ``router``, ``prefill``, ``decode``: the three roles' transitions; ``cluster``: the world
  (delivery, ticks, failures, drain);
- ``invariants``: the named safety rules;
- ``machine`` / ``check``: the state machine and ``kvspec pd check``;
- ``sim``: ``kvspec pd simulate`` (docs/pd-preallocation.md);
- ``mc``: ``kvspec pd verify``, the exhaustive model check of the same ``Design`` decisions.

Imports: harness.core, harness.targets, harness.check, harness.run, spec.
"""
