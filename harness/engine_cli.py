"""``kvspec engine``: ``kvspec fuzz --target vllm-engine`` (``harness.engine``) with the engine's own
families and the few options that mean something for it; the run itself is ``kvspec fuzz``'s."""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvspec.harness.run.options import FuzzOptions, UsageError


def add_engine_parser(sub: Any) -> None:
    """``kvspec engine``: ``kvspec fuzz --target vllm-engine`` with the engine's own families."""
    D = FuzzOptions
    e = sub.add_parser(
        "engine",
        help="real vLLM engines on tiny models with every check on: shadow, KV tensors, outputs (docs/engine.md)",
    )
    e.add_argument("--seconds", type=float, default=D.seconds, help="wall-time bound of the whole run (> 0)")
    e.add_argument("--seed", type=int, default=D.seed, help="any integer")
    e.add_argument("--out", default=D.out, help="report folder (written only on a finding; checked writable first)")
    e.add_argument("--family", default="all", help="comma-separated engine families, or 'all'")
    e.add_argument("--reduce-seconds", type=float, default=D.reduce_seconds, help="time bound for dropping requests")
    e.add_argument("--junit-xml", default=None, metavar="PATH", help="also write JUnit XML: one testcase per family")
    e.add_argument("--in-process", action="store_true", help="no supervising child (for a debugger)")


def engine_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> FuzzOptions:
    """``kvspec engine``'s options as the fuzz options of ``--target vllm-engine``, parsed by ``parser``
    (the ``kvspec`` parser) and checked the same way."""
    from dataclasses import replace

    from kvspec.harness.engine.workload import ENGINE_FAMILIES

    names = [f.strip() for f in args.family.split(",") if f.strip()]
    if names == ["all"]:
        names = list(ENGINE_FAMILIES)
    bad = [f for f in names if f not in ENGINE_FAMILIES]
    if bad or not names:
        known = ", ".join(ENGINE_FAMILIES)
        raise UsageError(f"unknown engine family {', '.join(bad) or '(none)'} (known: {known}, all)")
    argv = ["fuzz", "--target", "vllm-engine", "--seconds", str(args.seconds), "--seed", str(args.seed)]
    argv += ["--out", args.out, "--reduce-seconds", str(args.reduce_seconds)]
    argv += ["--junit-xml", args.junit_xml] if args.junit_xml else []
    argv += ["--in-process"] if args.in_process else []
    ns = parser.parse_args(argv)
    return replace(FuzzOptions.from_namespace(ns, os.environ), families=tuple(names))
