"""The P/D protocols on scripted workloads: each completes every request, moves the KV the way it
says (pull reads vs push writes), and breaks no safety rule."""

from collections import Counter

import pytest

from kvspec.harness.pd import cluster, router
from kvspec.harness.pd.designs import BASELINE, BUGS, PROPOSAL
from kvspec.harness.pd.instance import make_config
from kvspec.harness.pd.invariants import check_pd_invariants
from kvspec.harness.pd.state import ClusterState
from kvspec.harness.pd.types import Options
from kvspec.spec.types import RequestId

R0 = (1, 2, 3, 1, 2, 3, 1, 2, 3, 1)


def run(design, options=None, requests=((R0, 2),), d_blocks=12, crash_after=None):
    """Submit ``requests`` (then drain), checking every rule after every transition; returns the
    final state and the kinds of messages sent."""
    options = options or Options()
    s = cluster.init_cluster(design, options, make_config(12, 4, 64), make_config(d_blocks, 4, 64))
    sent: Counter[str] = Counter()
    seen: set[int] = set()

    def check(x: ClusterState) -> ClusterState:
        assert check_pd_invariants(x) == []
        for e in x.network:
            if e.mid not in seen:
                seen.add(e.mid)
                sent[type(e.msg).__name__] += 1
        return cluster.begin_step(x)

    for k, (prompt, max_tokens) in enumerate(requests):
        s = check(router.submit(s, RequestId(f"r{k}"), prompt, max_tokens))
    if crash_after is not None:
        for _ in range(crash_after):
            s = check(cluster.deliver(s, 0)) if s.network else s
        s = check(cluster.fail_prefill(s))
    s = cluster.drain(s, check)
    assert check_pd_invariants(s, idle=True) == []
    return s, sent


@pytest.mark.parametrize("design", [BASELINE, PROPOSAL, BUGS["release-on-cancel"].design], ids=lambda d: d.name)
@pytest.mark.parametrize("stream", ["end", "layerwise"])
def test_every_request_finishes(design, stream):
    s, sent = run(design, Options(num_decoders=2, stream=stream), requests=((R0, 2), (R0[:7], 3), ((2, 2), 1)))
    assert {r.phase for r in s.router.records.values()} == {"done"}
    if design.is_push:
        assert sent["Write"] > 0 and sent["Read"] == 0 and sent["Decode"] == 0
    else:
        assert sent["Read"] > 0 and sent["Write"] == 0 and sent["Reserve"] == 0


def test_push_writes_each_layer_of_each_block_once():
    _, sent = run(PROPOSAL, Options(num_layers=3))
    assert sent["Write"] == 3 * 3  # 10 tokens: 3 blocks of 4, 3 layers


def test_push_skips_the_decode_instances_own_prefix_hit():
    """Once r0 is done, D holds its two full blocks: r1 (same prefix, 10 tokens) reserves with a
    hit of 8 tokens and P writes only its third block."""
    s, _ = run(PROPOSAL, requests=((R0[:8] + (3,), 1),))
    s = router.submit(s, RequestId("r1"), R0, 1)
    writes = []

    def check(x: ClusterState) -> ClusterState:
        assert check_pd_invariants(x) == []
        writes.extend(e.msg for e in x.network if type(e.msg).__name__ == "Write" and e.msg not in writes)
        return cluster.begin_step(x)

    s = cluster.drain(s, check)
    assert s.router.records["r1"].phase == "done"
    assert {w.index for w in writes} == {2} and len(writes) == 2  # one block, two layers


@pytest.mark.parametrize("policy", ["baseline", "retry", "queue"])
def test_decoder_out_of_blocks(policy):
    """Three requests that do not all fit on one D: every fallback policy still finishes them."""
    s, sent = run(
        PROPOSAL,
        Options(num_decoders=2, on_reserve_fail=policy),
        requests=((R0, 2), (R0[::-1], 2), (R0[1:], 2)),
        d_blocks=5,
    )
    assert {r.phase for r in s.router.records.values()} == {"done"}


def test_prefill_failure_is_fenced_and_released():
    s, sent = run(PROPOSAL, crash_after=4)
    assert sent["PeerFailed"] == 2
    assert cluster.is_idle(s)


def test_time_out_revokes_and_falls_back_to_pull():
    """A lease shorter than the prefill: D revokes, P acknowledges, the router falls back to pull."""
    from kvspec.harness.pd.types import Timing

    s = cluster.init_cluster(PROPOSAL, Options(timing=Timing(lease=1)), make_config(12, 4, 64), make_config(12, 4, 64))
    s = router.submit(s, RequestId("r0"), R0, 1)
    for kind in ("Prefill", "Reserve", "Reserved", "Target"):
        s = cluster.deliver(s, next(k for k, e in enumerate(s.network) if type(e.msg).__name__ == kind))
    s = cluster.tick(s)  # the lease ends before P computed anything
    assert s.ds[0].jobs["r0"].phase == "revoking"
    s = cluster.drain(
        s,
        lambda x: (check_pd_invariants(x) == [] or pytest.fail(str(check_pd_invariants(x)))) and cluster.begin_step(x),
    )
    assert s.router.records["r0"].phase == "done" and s.router.records["r0"].pull
