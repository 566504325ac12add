"""Traces and reports: what a finding leaves behind, and how it is read, replayed and reduced.

- ``trace``: the versioned, language-neutral trace file; ``schema``: its free-form parts, parsed
  strictly; ``folders``: finding traces below folders;
- ``replay``: a trace replayed on a target, every step as recorded;
- ``reduce``: a finding's trace reduced by replaying operations;
- ``report``: the report folder (``trace.json``, a pytest file, ``report.md``), written atomically.

Imports: harness, harness.core, harness.targets, harness.check, harness.mutants, spec.
"""
