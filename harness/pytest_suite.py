"""The tests ``pytest --kvspec-target`` adds: one kvspec state machine per family, built by
``harness.pytest_plugin`` from the validated ``--kvspec-*`` options (none without them)."""

from harness.pytest_plugin import suite_testcases

globals().update(suite_testcases())
