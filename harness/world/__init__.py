"""The world: what arrives at vLLM's scheduler and what the world answers.

- ``families``: named configuration families (pools, groups, features) and their strategies;
- ``choices``: ``Choices``, where every answer of the world comes from (draws or a seeded RNG);
- ``scheduler``: kvspec's model of vLLM's scheduler-side bookkeeping, which decides the manager
  calls a real scheduler makes; ``outputs``: its output side (``update_from_output``, synchronous
  or async, drafts rolled back), a base class of the scheduler; ``transfer``: its KV-transfer side
  (a connector's answers, loads that arrive or fail), an object the scheduler holds; ``records``:
  what both keep (the knobs, the record of each request and the one way it changes, a step's batch);
- ``workload``: the one workload (arrivals, engine steps, the world's answers behind ``Choices``),
  drawn by Hypothesis (``harness.check.machine``) or a seeded generator (``run_seeded``).

Imports: harness.core, spec.
"""
