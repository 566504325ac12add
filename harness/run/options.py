"""The options of a kvspec run, checked before any work: a bad one is a ``UsageError`` (exit 2)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad usage: the message names the option and why (the CLI exits 2 on it)."""
