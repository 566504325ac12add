"""The guard's table (``harness.check.guard.FINDINGS``): what a target call raises becomes one finding.

Each kind of exception maps to its finding kind and message; ``KeyboardInterrupt`` and
``Unsupported`` pass through; ``SystemExit`` is a finding, not an exit.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.harness.check.finding import FindingError, StepTimeout
from kvspec.harness.check.guard import Call, guarded_call
from kvspec.harness.core import ops as O
from kvspec.harness.targets.base import Unsupported

OP = O.Free("r1")
CALL = Call("the target", 3, OP, "expected outcome")


class FakeKVFinding:
    """What ``harness.oracle``'s ``KVMismatch`` carries: a finding with ``to_markdown``."""

    summary = "request r1 reads wrong KV"
    block_ids = (4, 5)
    request_id = "r1"

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request_id}

    def to_markdown(self) -> str:
        return "## KV contents"


class KVMismatchLike(AssertionError):
    def __init__(self) -> None:
        super().__init__("wrong KV")
        self.finding = FakeKVFinding()


def raising(e: BaseException) -> Any:
    def fn() -> None:
        raise e

    return fn


def found(e: BaseException, call: Call = CALL) -> Any:
    with pytest.raises(FindingError) as info:
        guarded_call(call, 10.0, raising(e))
    return info.value.finding


@pytest.mark.parametrize(
    "exc, kind, message",
    [
        (StepTimeout(), "target-hung", "the target did not return within 10.0s"),
        (MemoryError("out"), "target-memory", "the target raised MemoryError: out (this may depend"),
        (KVMismatchLike(), "kv-mismatch", "request r1 reads wrong KV"),
        (ValueError("bad"), "target-raised", "the target raised ValueError: bad"),
        (SystemExit(3), "target-raised", "the target raised SystemExit: 3"),
        (GeneratorExit(), "target-raised", "the target raised GeneratorExit: "),
    ],
)
def test_each_exception_kind_maps_to_its_finding(exc: BaseException, kind: str, message: str) -> None:
    f = found(exc)
    assert f.kind == kind
    assert f.message.startswith(message)
    assert (f.step, f.op, f.expected) == (3, {"op": "free", "request_id": "r1"}, "expected outcome")


def test_a_kv_mismatch_carries_the_oracles_finding() -> None:
    f = found(KVMismatchLike())
    assert (f.blocks, f.requests) == ([4, 5], ["r1"])
    assert (f.kv, f.kv_markdown) == ({"request": "r1"}, "## KV contents")


def test_an_exception_with_a_finding_lacking_to_markdown_is_raised_not_a_kv_mismatch() -> None:
    e = ValueError("no KV")
    e.finding = object()  # type: ignore[attr-defined]
    assert found(e).kind == "target-raised"


def test_a_raise_keeps_its_traceback() -> None:
    f = found(ValueError("bad"))
    assert f.traceback is not None and "ValueError: bad" in f.traceback


def test_setup_calls_name_no_step_and_no_operation() -> None:
    f = found(StepTimeout(), Call("reset()", None))
    assert (f.kind, f.step, f.op, f.message) == ("target-hung", None, None, "reset() did not return within 10.0s")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), Unsupported("not modelled")])
def test_keyboard_interrupt_and_unsupported_propagate(exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        guarded_call(CALL, 10.0, raising(exc))


def test_a_call_that_returns_is_its_value() -> None:
    assert guarded_call(CALL, 10.0, lambda x: x + 1, 41) == 42
