"""The reference model of vLLM's v1 KV-cache manager (0.33.0, the base reading), pure Python, exact
down to block ids, free-queue order, published hashes and events.

Read it in this order (README): ``types`` (distinct ids and counts), ``arith`` (every formula, on ints
and Z3 terms alike), ``config``, ``hashing``, ``request``, ``block_pool`` (with ``persistent`` and
``linked_queue``), ``managers``, ``coordinator``, ``kv_cache_manager`` and ``slot_allocation``; then
the packages: ``releases`` (every other release as a profile of named changes; the bottom of spec/),
``invariants`` (one registry of named predicates) and ``kv_ledger`` (which KV each slot holds).
States are values: each operation returns a new state and an outcome.

Imports: spec.releases.
"""
