"""``kvspec prove [NAME...]``: decide the claims and print a table.

Exit status: 0 when every selected claim is proven; 1 when any has a counterexample (or an
existence claim is refuted); 2 on a solver timeout / unknown, or on bad usage (an unknown claim
name).  Counterexamples are written to ``--out`` (default ``kvspec-reports/``), one folder per
claim with ``counterexample.json`` and, when the claim has one, a replayable ``trace.json``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from pathlib import Path

from kvspec.harness.proofs.claims import all_claims
from kvspec.harness.proofs.core import COUNTEREXAMPLE, PROVEN, REFUTED, Claim, Result, run_claim
from kvspec.harness.proofs.report import write_report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvspec prove", description="Prove the spec's claims with Z3.")
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="claims to prove (exact names, prefixes such as 'allocate_slots', or globs); default: all",
    )
    p.add_argument("--list", action="store_true", help="list the claims with their statements and premises")
    p.add_argument("--timeout", type=float, default=20.0, help="per-claim solver timeout in seconds (default 20)")
    p.add_argument("--out", default="kvspec-reports", help="folder for counterexample reports")
    p.add_argument("--json", dest="json_path", help="also write the results as JSON to this path")
    return p


def select(names: list[str], claims: list[Claim]) -> list[Claim]:
    """Claims matching any of ``names`` (exact, ``prefix.``-style prefix, or glob), in table order.
    Raises ``KeyError`` naming the first pattern that matches nothing."""
    if not names:
        return claims
    chosen: list[Claim] = []
    for pattern in names:
        found = [
            c
            for c in claims
            if c.name == pattern or c.name.startswith(pattern + ".") or fnmatch.fnmatchcase(c.name, pattern)
        ]
        if not found:
            raise KeyError(pattern)
        chosen += [c for c in found if c not in chosen]
    return [c for c in claims if c in chosen]


def _row(r: Result) -> str:
    if r.outcome.status == PROVEN:
        one_line = r.outcome.detail and "\n" not in r.outcome.detail
        where = f"  ({r.outcome.detail})" if one_line else ""
    else:
        where = f"  [{r.outcome.goal}]" if r.outcome.goal else ""
    return f"{r.claim.name:44s} {r.outcome.status:15s} {r.seconds:7.2f}s{where}"


def prove_main(argv: list[str]) -> int:
    """``kvspec prove``: 0 every claim proven, 1 a counterexample or refutation (its report written),
    2 bad usage or a claim left unknown."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    claims = all_claims()
    try:
        selected = select(args.names, claims)
    except KeyError as e:
        print(f"kvspec prove: unknown claim {e.args[0]!r}; known claims:", file=sys.stderr)
        for c in claims:
            print(f"  {c.name}", file=sys.stderr)
        return 2
    if args.list:
        _print_claims(selected)
        return 0
    if args.timeout <= 0:
        print("kvspec prove: --timeout must be positive", file=sys.stderr)
        return 2
    print(f"{'claim':44s} {'result':15s} {'time':>8s}")
    start = time.perf_counter()
    results = [_prove_and_print(claim, args.timeout, Path(args.out)) for claim in selected]
    total = time.perf_counter() - start
    counts = {
        s: sum(r.outcome.status == s for r in results) for s in ("proven", "counterexample", "refuted", "unknown")
    }
    print(f"{len(results)} claims in {total:.2f}s: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    if args.json_path:
        _write_json(Path(args.json_path), results, total)
    if counts["counterexample"] or counts["refuted"]:
        return 1
    if counts["unknown"]:
        return 2
    return 0


def _print_claims(claims: list[Claim]) -> None:
    """``--list``: each claim, its statement, bound and premises."""
    for c in claims:
        print(f"{c.name}\n  {c.statement}\n  bound: {c.bound}")
        for p in c.premises:
            print(f"  premise: {p}")


def _prove_and_print(claim: Claim, timeout: float, out: Path) -> Result:
    """One claim proved (or not) and its row printed; a counterexample's report written under ``out``."""
    r = run_claim(claim, timeout)
    print(_row(r), flush=True)
    if r.outcome.status == PROVEN and "\n" in r.outcome.detail:  # derived conditions and examples
        for line in r.outcome.detail.splitlines():
            print(f"    {line}", flush=True)
    if r.outcome.status in (COUNTEREXAMPLE, REFUTED):
        scenario = claim.to_trace(r.outcome.model) if claim.to_trace and r.outcome.model else None
        folder = write_report(out, claim.name, r.outcome, scenario)
        print(f"    {r.outcome.detail or r.outcome.goal}", flush=True)
        print(f"    model: {json.dumps(dict(r.outcome.model), default=str)}", flush=True)
        print(f"    report: {folder}", flush=True)
    elif r.outcome.status != PROVEN:
        print(f"    {r.outcome.detail}", flush=True)
    return r


def _write_json(path: Path, results: list[Result], total: float) -> None:
    """``--json``: every claim's result, with its statement, premises and bound."""
    claims = [
        {
            "name": r.claim.name,
            "status": r.outcome.status,
            "seconds": round(r.seconds, 3),
            "goal": r.outcome.goal,
            "model": dict(r.outcome.model),
            "detail": r.outcome.detail,
            "statement": r.claim.statement,
            "premises": list(r.claim.premises),
            "bound": r.claim.bound,
        }
        for r in results
    ]
    path.write_text(json.dumps({"total_seconds": round(total, 3), "claims": claims}, indent=1, default=str) + "\n")


def main() -> None:
    raise SystemExit(prove_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
