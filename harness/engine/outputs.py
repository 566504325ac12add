"""The outputs check of the engine worker (``worker.py``): what the engines returned against the dense
float64 model (``dense.py``), once both engines of a model kind ran a workload."""

from __future__ import annotations

from typing import Any

from kvspec.harness.engine.workload import EngineWorkload


class EngineFinding(Exception):
    """A check failed: ``check`` (shadow, tables, kv, outputs, logprobs, engine-raised), the message,
    a witness, and for shadow the lockstep trace (JSON)."""

    def __init__(self, check: str, message: str, witness: dict[str, Any] | None = None, trace: Any = None) -> None:
        super().__init__(message)
        self.check, self.message, self.witness, self.trace = check, message, witness or {}, trace

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "message": self.message, "witness": self.witness, "trace": self.trace}


class Counts:
    """What the checks looked at (the driver's summary says which checks ran, and how much)."""

    def __init__(self) -> None:
        from collections import Counter

        self.c: Counter[str] = Counter()

    def add(self, **kw: int) -> None:
        self.c.update(kw)


LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1}
LOGIT_TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-1}
"""A greedy token may trail the dense argmax by this much (a near-tie), no more."""


def check_outputs(
    workload: EngineWorkload, on: dict[int, Any], off: dict[int, Any], dense: Any, dtype: str, counts: Counts
) -> None:
    """Greedy tokens against the dense argmax, prompt logprobs against the dense log-softmax, and
    the prefix cache on against off (worker docstring)."""
    import torch

    tol, lp_tol = LOGIT_TOLERANCE[dtype], LOGPROB_TOLERANCE[dtype]
    for i, r in enumerate(workload.requests):
        a, b = on.get(i), off.get(i)
        if a is None or b is None:  # aborted
            continue
        for side, res in (("on", a), ("off", b)):
            if res["prompt_logprobs"] is not None:
                run = dense.run(tuple(r.prompt))
                want = torch.log_softmax(run.logits[: len(r.prompt) - 1], dim=-1)
                for p, got in enumerate(res["prompt_logprobs"], 1):
                    exp = float(want[p - 1, r.prompt[p]])
                    counts.add(prompt_logprobs=1)
                    if not abs(got - exp) <= lp_tol:
                        raise EngineFinding(
                            "logprobs",
                            f"request {i} (prefix cache {side}): prompt logprob of position {p} is {got:.6g}, the "
                            f"dense model gives {exp:.6g}",
                            {"request": i, "position": p, "engine": got, "dense": exp, "cache": side},
                        )
            if r.n != 1:
                continue
            out = res["outputs"][0]
            run = dense.run(tuple(r.prompt) + tuple(out))
            for j, tok in enumerate(out):
                row = run.logits[len(r.prompt) - 1 + j]
                best = int(row.argmax())
                gap = float(row[best] - row[tok])
                counts.add(output_tokens=1)
                if gap > tol:
                    raise EngineFinding(
                        "outputs",
                        f"request {i} (prefix cache {side}): output token {j} is {tok}, the dense model's argmax is "
                        f"{best}, {gap:.3g} higher (tolerance {tol:g})",
                        {
                            "request": i,
                            "token": j,
                            "engine": tok,
                            "dense": best,
                            "gap": gap,
                            "cache": side,
                            "prompt_len": len(r.prompt),
                            "output": out,
                        },
                    )
        if r.n == 1 and a["outputs"] != b["outputs"]:
            counts.add(on_off_ties=1)  # both followed the dense argmax within tolerance: a near-tie
        elif r.n == 1:
            counts.add(on_off_equal=1)
