"""The tests ``pytest --kvspec-target`` adds: one kvspec state machine per family, built by
``harness.run.pytest_plugin`` from the validated ``--kvspec-*`` options (none without them)."""

from kvspec.harness.run.pytest_plugin import suite_testcases

globals().update(suite_testcases())
