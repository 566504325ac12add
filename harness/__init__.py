"""kvspec's harness: differential fuzzing of the spec against real KV-cache managers, reports, CLI."""

__version__ = "0.1.0"
