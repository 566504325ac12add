"""Running kvspec: the fuzzing loop and the ways users start it.

- ``options``: the options of a run (``FuzzOptions``, ``MutantsOptions``), built once and checked
  before any work (``UsageError``: exit 2);
- ``fuzzing``: the loop behind ``kvspec fuzz``; ``finish``: its summary and the one report;
- ``workers``: ``--workers N`` processes on one example database; ``signals``: SIGINT and SIGTERM;
- ``profiles``: the Hypothesis profiles; ``junit``: JUnit XML for CI;
- ``pytest_plugin`` and ``pytest_suite``: kvspec as a pytest plugin.

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, harness.oracle,
harness.mutants, harness.check, harness.traces, spec, impl.
"""
