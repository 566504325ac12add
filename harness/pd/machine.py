"""The Hypothesis state machine over router, P and the decode instances.

Each rule is one thing the world does: a client submits or aborts, the network delivers any
message in flight (so messages are delayed and reordered), time passes, an instance runs an engine
step, a transfer fails, P is declared failed, a router retries a reservation elsewhere.  After
every rule the safety rules of ``harness.pd.invariants`` are checked on the cluster; at the end
``drain`` runs it to rest and ``no_leak_at_idle`` is checked.  With a ``mirror`` (``--target
vllm``), every manager call the spec made is replayed on one real vLLM 0.33 ``KVCacheManager`` per
instance (``harness.pd.mirror``), which must give the same outcomes and states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvspec.harness.check.hypothesis_run import run_as_test
from kvspec.harness.pd import cluster, prefill, router
from kvspec.harness.pd.instance import make_config
from kvspec.harness.pd.invariants import PDViolation, check_pd_invariants
from kvspec.harness.pd.state import ClusterState
from kvspec.harness.pd.types import Design, Options, Timing
from kvspec.spec.types import RequestId

BLOCK_SIZE = 4
MAX_REQUESTS = 4
PROMPT_STEMS = ((1, 2, 3, 1, 2, 3, 1, 2), (2, 2, 1, 3), ())  # shared prefixes make prefix hits common


class PDFinding(AssertionError):
    """A safety rule broke (or a real manager disagreed with the spec); carries the rule trace."""

    def __init__(self, violation: PDViolation, trace: Sequence[str]) -> None:
        super().__init__(str(violation))
        self.violation = violation
        self.trace = list(trace)


@dataclass
class PDRunStats:
    examples: int = 0
    steps: int = 0
    rules: dict[str, int] = field(default_factory=dict)
    last_finding: PDFinding | None = None

    def count(self, name: str) -> None:
        self.rules[name] = self.rules.get(name, 0) + 1
        self.steps += 1


class PDMachine(RuleBasedStateMachine):
    design: Design
    names: Sequence[str] | None = None  # the rules to check (None: all)
    make_mirror: Callable[[], Any] | None = None
    stats: PDRunStats

    def __init__(self) -> None:
        super().__init__()
        self.s: ClusterState | None = None
        self.trace: list[str] = []
        make_mirror = type(self).make_mirror
        self.mirror = make_mirror() if make_mirror is not None else None
        self.crashed = False
        self.stats.examples += 1

    # --- the check after every transition --------------------------------------------------------

    def _after(self, what: str, s: ClusterState) -> None:
        self.trace.append(what)
        self.stats.count(what.split("(")[0])
        self.s = self._judge(s)

    def _judge(self, s: ClusterState, idle: bool = False) -> ClusterState:
        if self.mirror is not None:
            problem = self.mirror.replay(s)
            if problem is not None:
                self._fail(PDViolation("vllm_agrees_with_spec", problem))
        violations = check_pd_invariants(s, self.names, idle=idle)
        if violations:
            self._fail(violations[0])
        return cluster.begin_step(clear_logs(s))

    def _fail(self, v: PDViolation) -> None:
        finding = PDFinding(v, self.trace)
        type(self).stats.last_finding = finding
        raise finding

    # --- rules ---------------------------------------------------------------------------------

    @initialize(
        num_decoders=st.integers(1, 2),
        on_reserve_fail=st.sampled_from(("baseline", "retry", "queue")),
        stream=st.sampled_from(("end", "layerwise")),
        p_blocks=st.integers(6, 14),
        d_blocks=st.integers(6, 12),
        chunk=st.sampled_from((4, 8)),
        lease=st.sampled_from((24, 3)),
    )
    def setup(
        self, num_decoders: int, on_reserve_fail: str, stream: str, p_blocks: int, d_blocks: int, chunk: int, lease: int
    ) -> None:
        timing = Timing(lease=lease)
        options = Options(num_decoders, on_reserve_fail, stream, chunk_tokens=chunk, timing=timing)  # type: ignore[arg-type]
        s = cluster.init_cluster(
            self.design, options, make_config(p_blocks, BLOCK_SIZE, 64), make_config(d_blocks, BLOCK_SIZE, 64)
        )
        what = (
            f"{self.design.name}, decoders={num_decoders}, on_fail={on_reserve_fail}, "
            f"{stream}, P={p_blocks}, D={d_blocks}, chunk={chunk}, lease={lease}"
        )
        self._after(f"setup({what})", s)

    @precondition(lambda m: m.s is not None and len(m.s.router.records) < MAX_REQUESTS)
    @rule(
        stem=st.integers(0, len(PROMPT_STEMS) - 1),
        tail=st.lists(st.integers(1, 3), max_size=6),
        max_tokens=st.integers(1, 3),
    )
    def submit(self, stem: int, tail: list[int], max_tokens: int) -> None:
        assert self.s is not None
        prompt = (PROMPT_STEMS[stem] + tuple(tail))[:12] or (1,)
        rid = RequestId(f"r{len(self.s.router.records)}")
        self._after(
            f"submit({rid}, {list(prompt)}, max_tokens={max_tokens})", router.submit(self.s, rid, prompt, max_tokens)
        )

    @precondition(lambda m: m.s is not None and bool(m.s.network))
    @rule(k=st.integers(0, 63))
    def deliver(self, k: int) -> None:
        assert self.s is not None
        k %= len(self.s.network)
        env = self.s.network[k]
        self._after(
            f"deliver({type(env.msg).__name__} {env.src}->{env.dst} {_brief(env.msg)})", cluster.deliver(self.s, k)
        )

    @precondition(lambda m: m.s is not None and cluster.is_tick_enabled(m.s))
    @rule()
    def tick(self) -> None:
        assert self.s is not None
        self._after(f"tick(-> {self.s.now + 1})", cluster.tick(self.s))

    @precondition(lambda m: m.s is not None)
    @rule()
    def prefill_step(self) -> None:
        assert self.s is not None
        self._after("prefill_step()", prefill.p_step(self.s))

    @precondition(lambda m: m.s is not None)
    @rule(i=st.integers(0, 1))
    def decode_step(self, i: int) -> None:
        assert self.s is not None
        i %= len(self.s.ds)
        self._after(f"decode_step(D{i})", cluster.step_decoder(self.s, i))

    @precondition(lambda m: m.s is not None and bool(m.s.router.records))
    @rule(j=st.integers(0, MAX_REQUESTS - 1))
    def abort(self, j: int) -> None:
        assert self.s is not None
        rid = sorted(self.s.router.records)[j % len(self.s.router.records)]
        self._after(f"abort({rid})", router.abort(self.s, rid))

    @precondition(lambda m: m.s is not None and bool(m.s.router.records) and len(m.s.ds) > 1)
    @rule(j=st.integers(0, MAX_REQUESTS - 1))
    def retry_elsewhere(self, j: int) -> None:
        assert self.s is not None
        rid = sorted(self.s.router.records)[j % len(self.s.router.records)]
        self._after(f"retry_elsewhere({rid})", router.retry_elsewhere(self.s, rid))

    @precondition(lambda m: m.s is not None and any(type(e.msg).__name__ in ("Write", "ReadData") for e in m.s.network))
    @rule(k=st.integers(0, 63))
    def fail_transfer(self, k: int) -> None:
        assert self.s is not None
        carriers = [n for n, e in enumerate(self.s.network) if type(e.msg).__name__ in ("Write", "ReadData")]
        n = carriers[k % len(carriers)]
        self._after(f"fail_transfer({_brief(self.s.network[n].msg)})", cluster.fail_transfer(self.s, n))

    @precondition(lambda m: m.s is not None and not m.crashed)
    @rule()
    def fail_prefill(self) -> None:
        assert self.s is not None
        self.crashed = True
        self._after(f"fail_prefill(epoch {self.s.p.epoch})", cluster.fail_prefill(self.s))

    @invariant()
    def alive(self) -> None:  # keeps Hypothesis' invariant phase cheap: the rules judge every step
        pass

    def teardown(self) -> None:
        if self.s is None:
            return
        self.trace.append("drain()")
        s = cluster.drain(self.s, on_step=lambda x: self._judge(x))
        self._judge(s, idle=True)


def clear_logs(s: ClusterState) -> ClusterState:
    """The manager-call logs were replayed (or are not needed): drop them."""
    p = s.p if not s.p.inst.log else replace(s.p, inst=replace(s.p.inst, log=()))
    ds = tuple(d if not d.inst.log else replace(d, inst=replace(d.inst, log=())) for d in s.ds)
    return replace(s, p=p, ds=ds)


def _brief(msg: Any) -> str:
    fields = [f"{k}={getattr(msg, k)}" for k in ("rid", "lease", "index", "layer", "dst") if hasattr(msg, k)]
    return " ".join(fields)


def make_pd_machine(
    design: Design, names: Sequence[str] | None = None, make_mirror: Callable[[], Any] | None = None
) -> type[PDMachine]:
    """A machine class for one design (its own example-database key), checking ``names``."""
    label = design.name.replace(":", "_").replace("-", "_")
    attrs = {
        "design": design,
        "names": names,
        "make_mirror": staticmethod(make_mirror) if make_mirror else None,
        "stats": PDRunStats(),
    }
    return type(f"PDMachine_{label}{'_vllm' if make_mirror else ''}", (PDMachine,), attrs)


def run_pd_machine(
    cls: type[PDMachine], hyp_settings: settings, seed: int | None = None, shrink_seconds: int = 60
) -> None:
    """Run the machine as one Hypothesis test (shrinking bounded by ``shrink_seconds``); raises
    after shrinking on a finding, which ``cls.stats.last_finding`` then holds (the last failing
    run is the shrunk one).  The factory's text is part of the example-database key
    (``harness.check.hypothesis_run.run_as_test``)."""

    def factory() -> PDMachine:
        return cls()

    run_as_test(factory, cls.__name__, hyp_settings, seed, shrink_seconds)
