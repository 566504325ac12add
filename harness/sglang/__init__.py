"""SGLang's radix cache as a kvspec target (``--target sglang``).

``load`` finds SGLang (its own light venv, ``ci/setup --sglang``) and holds the CPU shims, ``build``
makes SGLang's pools and ``UnifiedRadixCache`` for a kvspec config, ``target`` drives them through
kvspec's operations the way SGLang's scheduler does, ``observe`` reads them back in kvspec's
vocabulary, ``compare`` runs vLLM's and SGLang's caches on the same workloads side by side
(docs/sglang.md's table).  The target's engine is ``sglang``: the engine-neutral invariants, SGLang's own
(``spec.invariants.state_sglang``) and the KV ledger hold it, vLLM's policy does not.

SGLang and torch are imported lazily, through ``load``.

Imports: harness.core, harness.sglang, harness.targets, harness.world, spec.
"""
