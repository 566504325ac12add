"""The grammar of ``--target`` names, which says whether resolving a name runs a user's code.

A name with no colon (``spec``, ``vllm``, ``impl``, ``vllm-fixed``, ``vllm-scheduler``) is one of
kvspec's built-in targets, and ``mutant:NAME`` one of its deliberate bugs: both are looked up in the
target catalogue (``harness.run.catalogue``), which imports no code a name chooses.  Any other name
with a colon is a user's ``package.module:factory``: resolving it imports and calls that code, so a
trace file never chooses one (``kvspec replay`` takes it from the command line only).
"""

from __future__ import annotations

MUTANT_PREFIX = "mutant:"


def is_user_target(name: str) -> bool:
    """Does ``name`` name a user's ``package.module:factory`` (code that resolving it imports)?"""
    return ":" in name and not name.startswith(MUTANT_PREFIX)
