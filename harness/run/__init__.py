"""Running kvspec: the target catalogue, the one run loop and the ways users start it.

- ``catalogue``: what ``--target X`` names (``resolve``, the one resolver): the factory, the driver,
  the default relation, the families, the start-up; ``replay_target`` for recorded traces;
- ``options``: the options of a run (``FuzzOptions``, ``MutantsOptions``), built once and checked
  before any work (``UsageError``: exit 2); the environment read at the edges (``from_environ``);
- ``fuzzing``: the one run loop (``run_fuzz``); ``finish``: its summary and the one report;
  ``exits``: every command's exit codes;
- ``supervise``: the run in a child process it outlives, a crash or hang of the target a finding;
- ``replays``: ``kvspec replay``; ``workers``: ``--workers N`` processes on one example database;
  ``signals``: SIGINT and SIGTERM; ``startup``: the cold start's figures;
- ``profiles``: the Hypothesis profiles; ``junit``: JUnit XML for CI; ``paths``: folders checked writable;
- ``pytest_plugin`` and ``pytest_suite``: kvspec as a pytest plugin.

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, harness.oracle,
harness.mutants, harness.check, harness.traces, harness.drivers, harness.vllm_sched, harness.engine,
harness.sglang, spec, impl.
"""
