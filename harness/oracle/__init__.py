"""The torch KV-content oracle: wrapped around any target, it checks the numbers attention reads.

- ``target``: ``KVCheckTarget``, the wrapper (``kvspec fuzz --kv-check``);
- ``runner``: the model runner, what each scheduler-side event means for the KV cache;
- ``paged``: the tiny model and the paged cache for one config; ``dense``: the dense float64 reference;
- ``request``: the oracle's own facts about a request; ``finding``: what a mismatch reports.

Imports: harness.core, harness.ledger, harness.targets, spec, impl.
"""
