"""What the crash safety costs: ``kvspec fuzz`` supervised (the default) against ``--in-process``.

``python -m kvspec.harness.bench.supervision [--target vllm] [--family all] [--seconds 30] [--rounds 2] [--seed 1]``

Runs the same command, seed and families both ways, alternating (``--rounds`` each, so a machine
getting busier weighs on both), and prints each run's steps/s (from its summary line) and the ratio
of the supervised mean to the in-process mean.  The supervised run forks once and writes one flight
record per operation (``harness.core.flight``); ``--in-process`` does neither.  Only prints.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

_RATE = re.compile(r"\((\d+) steps/s\)")


def one_run(target: str, family: str, seconds: float, seed: int, in_process: bool) -> float:
    """The steps/s one ``kvspec fuzz`` run prints (a run that finds something is an error here)."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, "-m", "kvspec.harness", "fuzz", "--target", target, "--family", family]
        argv += ["--seconds", f"{seconds:g}", "--seed", str(seed), "--out", out, "--db", f"{out}/db"]
        argv += ["--in-process"] if in_process else []
        run = subprocess.run(argv, capture_output=True, text=True, check=False)
    m = _RATE.search(run.stdout)
    if run.returncode != 0 or m is None:
        raise SystemExit(f"bench: {' '.join(argv[2:])} exited {run.returncode}:\n{run.stdout}{run.stderr}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvspec.harness.bench.supervision", description=__doc__)
    p.add_argument("--target", default="vllm")
    p.add_argument("--family", default="all")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(a.rounds):
        for in_process in (True, False) if r % 2 == 0 else (False, True):
            rate = one_run(a.target, a.family, a.seconds, a.seed, in_process)
            rates[in_process].append(rate)
            print(f"round {r}: {'in-process' if in_process else 'supervised'} {rate:8.0f} steps/s", flush=True)
    inproc, sup = statistics.mean(rates[True]), statistics.mean(rates[False])
    print(f"target {a.target}, families {a.family}, {a.seconds:g}s x {a.rounds} rounds each, seed {a.seed}")
    print(f"in-process {inproc:.0f} steps/s, supervised {sup:.0f} steps/s: ratio {sup / inproc:.3f}")


if __name__ == "__main__":
    main()
