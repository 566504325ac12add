"""Drivers: the ways one example becomes checked steps, all run by the one loop (``harness.run.loop``).

- ``base``: the ``Driver`` protocol, what a turn gives back (``TurnOutcome``, ``Found``), what a run
  counted (``Tally``), the settings and hooks the loop hands a driver, and ``reduce_finding`` (a
  finding's operations replayed smaller, ``harness.traces.reduce``);
- ``lockstep``: the manager lockstep: Hypothesis' state machine (``harness.check.machine``) draws
  the workload, one turn is one batch of examples of one family;
- ``isolated``: a call in a forked child, whose crash is a ``Crash`` (the flight log of
  ``harness.core.flight``) and a ``target-crashed`` finding; crash traces reduced and replayed there.

vLLM's real scheduler is the other driver (``harness.vllm_sched.fuzz``); the target catalogue
(``harness.run.catalogue``) says which driver runs which target.  docs/architecture.md says how to add
one: a new driver touches neither ``harness/cli.py`` nor the loop.

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, harness.oracle,
harness.mutants, harness.check, harness.traces, spec.
"""
