"""The manager proxy as the record/shadow plugin uses it inside a user's engine (issue 34): every call
reaches the real manager with exactly the scheduler's arguments, on any release's signatures, also
once recording is over; a call the mirror cannot follow turns mirroring off and the engine serves on.
A fake manager with vLLM 0.32's signatures stands in for the real one (no vLLM needed)."""

from __future__ import annotations

from typing import Any

import pytest

from kvspec.harness.core import ops as O
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.vllm_sched.proxy import ManagerProxy


class Manager032:
    """vLLM 0.32's ``get_computed_blocks`` takes the request only (0.33 added ``max_cache_hit_length``)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def get_computed_blocks(self, request: Any) -> Any:
        self.calls.append(("get_computed_blocks", (request,)))
        return ([], 0, 0)

    def free(self, request: Any) -> None:
        self.calls.append(("free", (request,)))


class DoneSink:
    done = True

    def request_op(self, op: O.Op, request: Any) -> None:
        raise AssertionError("a done sink is told nothing")

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        raise AssertionError("a done sink is told nothing")


class RefusingSink:
    """Mirrors nothing: every request operation is one the mirror cannot follow."""

    done = False

    def request_op(self, op: O.Op, request: Any) -> None:
        raise Unsupported("not followed here")

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None:
        raise AssertionError("never reached")


class Request:
    request_id = "r1"
    status = type("S", (), {"name": "WAITING"})()
    prompt_token_ids = [1, 2, 3]
    lora_request = None
    mm_features = None
    cache_salt = None
    prompt_embeds = None
    skip_reading_prefix_cache = False
    num_computed_tokens = 0
    num_in_flight_tokens = 0
    spec_token_ids: list[int] = []
    output_token_ids: list[int] = []


def test_a_full_trace_passes_calls_through_with_the_schedulers_own_arguments() -> None:
    real = Manager032()
    proxy = ManagerProxy(real, DoneSink(), tolerant=True)
    req = Request()
    assert proxy.get_computed_blocks(req) == ([], 0, 0)  # 0.32's one-argument call, not two
    proxy.free(req)
    assert real.calls == [("get_computed_blocks", (req,)), ("free", (req,))]


def test_what_the_mirror_cannot_follow_stops_mirroring_and_the_call_still_happens_once() -> None:
    real = Manager032()
    proxy = ManagerProxy(real, RefusingSink(), tolerant=True)
    req = Request()
    assert proxy.get_computed_blocks(req) == ([], 0, 0)
    assert proxy.off == "not followed here" and proxy.passing
    proxy.free(req)
    assert real.calls == [("get_computed_blocks", (req,)), ("free", (req,))]


def test_kvspecs_own_drivers_still_hear_about_it() -> None:
    proxy = ManagerProxy(Manager032(), RefusingSink())
    with pytest.raises(Unsupported):
        proxy.get_computed_blocks(Request())


def test_arguments_a_release_does_not_take_are_refused_not_passed_on() -> None:
    proxy = ManagerProxy(Manager032(), RefusingSink())
    with pytest.raises(Unsupported, match="arguments its signature does not take"):
        proxy.get_computed_blocks(Request(), 5)
