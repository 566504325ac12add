"""The world around the three roles: a cluster's initial state, message delivery (any message in
flight, in any order), the clock, and failures (a transfer failing, P being declared failed).

Partial synchrony: every message is delivered within ``Timing.max_delay`` ticks of being sent, so
the clock may not move past an undelivered message's bound (``is_tick_enabled``); time-outs fire
on the tick that reaches them.  Within that bound the order is arbitrary.  ``drain`` runs the
cluster to rest (fair delivery, every instance stepping, time passing), which is where
``no_leak_at_idle`` is judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvspec.harness.pd import decode, dsched, prefill, router
from kvspec.harness.pd import instance as I
from kvspec.harness.pd import messages as M
from kvspec.harness.pd.state import ClusterState, DState, PState, RouterState, get_d_index, send
from kvspec.harness.pd.types import PREFILL, Design, Epoch, InstanceId, Options, Tick
from kvspec.spec.config import KVCacheConfig

FAILURE_DETECTOR = "detector"


def init_cluster(design: Design, options: Options, p_config: KVCacheConfig, d_config: KVCacheConfig) -> ClusterState:
    p = PState(I.init_instance(PREFILL, p_config), Epoch(0))
    ds = tuple(DState(I.init_instance(InstanceId(f"D{k}"), d_config)) for k in range(options.num_decoders))
    return ClusterState(design, options, Tick(0), RouterState(), p, ds)


def begin_step(s: ClusterState) -> ClusterState:
    """Forget the previous transition's data-plane facts (the invariants have judged them)."""
    return replace(s, events=()) if s.events else s


def deliver(s: ClusterState, k: int) -> ClusterState:
    """Deliver the ``k``-th message in flight (the network may pick any)."""
    env = s.network[k]
    s = replace(s, network=s.network[:k] + s.network[k + 1 :])
    if env.dst == router.ROUTER:
        return router.deliver_to_router(s, env.msg)
    if env.dst == PREFILL:
        return prefill.deliver_to_p(s, env)
    return decode.deliver_to_d(s, get_d_index(s, InstanceId(str(env.dst))), env)


def is_tick_enabled(s: ClusterState) -> bool:
    """Time may pass only while no message is overdue."""
    bound = s.options.timing.max_delay
    return all(env.sent + bound > s.now for env in s.network)


def tick(s: ClusterState) -> ClusterState:
    assert is_tick_enabled(s), "a message is overdue: deliver it first"
    s = replace(s, now=Tick(s.now + 1))
    s = prefill.p_tick(s)
    for i in range(len(s.ds)):
        s = decode.d_tick(s, i)
    return s


def step_decoder(s: ClusterState, i: int) -> ClusterState:
    return dsched.d_step(s, i)


def fail_transfer(s: ClusterState, k: int) -> ClusterState:
    """The ``k``-th message in flight, if it carries KV, fails (an error completion)."""
    env = s.network[k]
    if not isinstance(env.msg, (M.Write, M.ReadData)) or not env.msg.ok:
        return s
    failed = replace(env.msg, ok=False) if isinstance(env.msg, M.Write) else replace(env.msg, ok=False, content=None)
    return replace(s, network=s.network[:k] + (replace(env, msg=failed),) + s.network[k + 1 :])


def fail_prefill(s: ClusterState) -> ClusterState:
    """P is declared failed and replaced by a fresh incarnation; the old one's messages already in
    flight keep flying (a declared-failed instance may be merely slow).  The failure detector
    tells the router and every decode instance."""
    old = s.p.epoch
    p = PState(I.init_instance(PREFILL, s.p.inst.config), Epoch(old + 1))
    s = replace(s, p=p)
    s = send(s, FAILURE_DETECTOR, router.ROUTER, M.PeerFailed(old))
    for d in s.ds:
        s = send(s, FAILURE_DETECTOR, d.inst.name, M.PeerFailed(old))
    return s


def is_idle(s: ClusterState) -> bool:
    """No request is live, nothing is in flight, no role tracks any request."""
    live = any(router.is_live(r) for r in s.router.records.values())
    return not live and not s.network and not s.p.jobs and not any(d.jobs for d in s.ds)


def drain(
    s: ClusterState, on_step: Callable[[ClusterState], ClusterState] | None = None, max_rounds: int = 400
) -> ClusterState:
    """Run to rest: deliver everything in flight (oldest first), step every instance, let time
    pass; stop at idle, or after ``max_rounds`` rounds (time-outs included) without reaching it.
    ``on_step`` sees the state after every transition (the invariants judge each one) and
    returns the state to go on with."""

    def step(s: ClusterState, fn: Callable[[ClusterState], ClusterState]) -> ClusterState:
        s = fn(begin_step(s))
        return on_step(s) if on_step is not None else s

    for _ in range(max_rounds):
        while s.network:
            s = step(s, lambda x: deliver(x, 0))
        s = step(s, prefill.p_step)
        for i in range(len(s.ds)):
            s = step(s, lambda x, i=i: step_decoder(x, i))  # type: ignore[misc]
        if is_idle(s):
            break
        if not s.network:
            s = step(s, tick)
    return begin_step(s)
