"""``CheckSettings``: what a lockstep checks and how, one frozen value passed down explicitly.

The run's options (``harness.run.options.FuzzOptions.checks``) build it once; ``Lockstep``, the state
machine (``harness.check.machine``), the replay and the reduction take it as an argument.  Nothing
below ``harness/run/`` reads the environment: the variables that set these (``KVSPEC_TARGET_MEMORY_MB``,
``KVSPEC_FULL_CHECK_EVERY``) are read at the edges (the CLI, the pytest plugin) into the options.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckSettings:
    """How one lockstep run is checked; the defaults are ``kvspec fuzz``'s.

    ``relation``: the equality relation (``harness.core.equality.RELATIONS``); ``step_timeout``:
    seconds one target call may take (None: no bound); ``ledger``: the KV ledger on the target
    (``--no-ledger`` turns it off); ``strict_known``: a finding matching a known target bug fails the
    run too (``--strict-known``), else it is counted; ``memory_mb``: the bound on how much the target
    may grow the process' memory, in MiB (None: off); ``full_check_every``: whole observations
    compared every that many operations, glimpses in between (None: by pool size,
    ``harness.core.glimpse.full_check_every``); ``kv_check``: the target is wrapped in the KV-content
    oracle (``--kv-check``)."""

    relation: str = "exact"
    step_timeout: float | None = 10.0
    ledger: bool = True
    strict_known: bool = False
    memory_mb: float | None = None
    full_check_every: int | None = None
    kv_check: bool = False


DEFAULT_CHECKS = CheckSettings()
"""``kvspec fuzz``'s checks, for the signatures that default to them."""
