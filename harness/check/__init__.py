"""Lockstep: the spec and a target stepped together, and everything checked after each step.

- ``lockstep``: ``Lockstep`` applies one operation to both and checks the relation, the
  invariants, the KV ledger and the target's memory; the first problem is a ``FindingError``;
- ``guard``: every call into a target guarded, one table from what it raises to the finding;
- ``witness``: the finding of a failed check after an operation, with its witness;
- ``finding``: the ``Finding`` a run reports, and the per-step timeout on target calls;
- ``obs_invariants``: the spec's invariants on any target's observation;
- ``memory_guard``: the bound on how much a target may grow the process' memory;
- ``machine``: the Hypothesis state machine that draws the workload and steps a ``Lockstep``;
- ``hypothesis_run``: a state machine run as one Hypothesis test (seed, database key, shrinking
  bound): the one place that touches Hypothesis' private attributes, for this machine and P/D's.

Imports: harness, harness.core, harness.world, harness.targets, harness.ledger, spec.
"""
