"""The vLLM releases kvspec models, as a user meets them: ``kvspec releases`` and ``kvspec releases diff``.

- ``diff``: drive two releases' profiles with the same seeded workloads (the spec under the old
  release as the reference, the spec under the new one as the target, exact relation) and name
  each behaviour change met, attributed to the ``spec.releases`` change that makes it;
- ``cli``: the ``kvspec releases`` command (the list, with what each release changes and its
  known bugs; ``diff OLD NEW``).

Imports: harness, harness.core, harness.targets, harness.ledger, harness.traces, harness.run, spec.
"""
