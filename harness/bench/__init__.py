"""Benchmarks that print figures: ``python -m kvspec.harness.bench allocator|lockstep|attention``.

- ``allocator``: kvspec's impl allocator against vLLM's manager and the spec (and the command line);
- ``lockstep``: where a lockstep step's time goes, and whether it grows with the pool;
- ``workers``: the speed-up of ``kvspec fuzz --workers N``;
- ``supervision``: what the crash safety costs (``kvspec fuzz`` supervised against ``--in-process``).

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, harness.oracle,
harness.mutants, harness.check, harness.traces, harness.run, spec, impl.
"""
