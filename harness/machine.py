"""The rule-based Hypothesis state machine: a faithful vLLM 0.33 scheduler driving the spec and a
target in lockstep (``harness.lockstep``), stopping at the first divergence or broken invariant.

Each rule is one scheduler action (a request arrives, an engine step, a request finishes or is
aborted, a remote KV load arrives, a prefix-cache reset, an event drain) and emits one or more
``harness.ops`` operations through ``harness.scheduler``.  ``make_machine`` builds one machine class
per (family, target, relation) so that each has its own example-database key: CI re-tries the past
failures of exactly that combination first.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from harness import ops as O
from harness.families import configs, near_multiples
from harness.lockstep import Finding, FindingError, Lockstep
from harness.scheduler import SchedConfig, Scheduler
from harness.targets.base import Target, Unsupported
from spec.config import KVCacheConfig

ALPHABET = (1, 2, 3)  # small: identical blocks under different prefixes are common
MAX_LIVE_REQUESTS = 8
MM_ITEM_LENGTHS = {"img-a": 2, "img-b": 5}  # multimodal items: identifier -> placeholder tokens


@dataclass
class RunStats:
    """Shared by all examples of one fuzzing campaign (rule and operation coverage, speed)."""

    examples: int = 0
    steps: int = 0  # operations applied
    rules: Counter[str] = field(default_factory=Counter)  # family:rule -> times run
    events: Counter[str] = field(default_factory=Counter)  # family:what the scheduler did -> times
    ops: Counter[str] = field(default_factory=Counter)
    unsupported: Counter[str] = field(default_factory=Counter)
    finding: Finding | None = None
    finding_steps: list[tuple[O.Op, Any]] = field(default_factory=list)
    finding_config: KVCacheConfig | None = None
    target_version: str = ""
    started: float = 0.0  # time.monotonic() when the campaign started
    first_finding_after: float | None = None  # seconds to the first failing example (before shrinking)


class DrawChoices:
    """``harness.scheduler.Choices`` backed by Hypothesis draws (so choices shrink)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        if hi <= lo:
            return lo
        strat = near_multiples(boundary, lo, hi) if boundary else st.integers(lo, hi)
        return int(self.data.draw(strat, label=label))

    def boolean(self, label: str) -> bool:
        return bool(self.data.draw(st.booleans(), label=label))

    def token(self, label: str) -> int:
        return int(self.data.draw(st.sampled_from(ALPHABET), label=label))


class _Rebind:
    """Let a machine's scheduler draw from the data object of the rule being run."""

    def __init__(self) -> None:
        self.inner: DrawChoices | None = None

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        assert self.inner is not None
        return self.inner.integer(lo, hi, label, boundary)

    def boolean(self, label: str) -> bool:
        assert self.inner is not None
        return self.inner.boolean(label)

    def token(self, label: str) -> int:
        assert self.inner is not None
        return self.inner.token(label)


def sched_configs(config: KVCacheConfig) -> st.SearchStrategy[SchedConfig]:
    bs = config.scheduler_block_size

    @st.composite
    def build(draw: st.DrawFn) -> SchedConfig:
        k = draw(st.sampled_from([0, 0, 1, 2, 3]))
        return SchedConfig(
            token_budget=draw(near_multiples(bs, 1, 4 * bs + 1)),
            max_num_seqs=draw(st.integers(1, 6)),
            max_model_len=config.max_model_len,
            block_size=bs,
            num_spec_tokens=k,
            num_lookahead_tokens=draw(st.sampled_from([0, k])) if k else 0,
            connector=draw(st.booleans()),
            reserve_full_isl=draw(st.integers(0, 3)) == 0,
            single_group=len(config.groups) == 1,
        )

    return build()


class KVMachine(RuleBasedStateMachine):
    """Configured by ``make_machine``: ``family``, ``target_factory``, ``relation``, ``stats``."""

    family = "full"
    target_factory: Callable[[], Target]
    relation = "exact"
    stats: RunStats
    step_timeout: float | None = 10.0
    kv_check = False  # the target is wrapped in the KV-content oracle

    def __init__(self) -> None:
        super().__init__()
        self.ls: Lockstep | None = None
        self.sched: Scheduler | None = None
        self.choices = _Rebind()
        self.prefixes: list[tuple[int, ...]] = []
        self.prompts: list[tuple[int, ...]] = []

    # --- plumbing ------------------------------------------------------------------------------

    def _emit(self, op: O.Op) -> Any:
        assert self.ls is not None
        self.stats.steps += 1
        return self._lockstep_call(self.ls.apply, op)

    def _lockstep_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """An example the target cannot model is discarded; a finding is recorded and raised."""
        try:
            return fn(*args)
        except Unsupported as e:
            self.stats.unsupported[str(e)[:80]] += 1
            assume(False)
        except FindingError as e:
            self._record(e.finding)
            raise

    def _record(self, finding: Finding) -> None:
        assert self.ls is not None
        if self.stats.first_finding_after is None:
            import time

            self.stats.first_finding_after = time.monotonic() - self.stats.started
        self.stats.finding = finding
        self.stats.finding_steps = list(self.ls.steps)
        self.stats.finding_config = self.ls.config

    def _table(self, rid: str) -> tuple[int, ...]:
        assert self.ls is not None and self.ls.tgt_obs is not None
        return self.ls.tgt_obs.tables[0].get(rid, ())

    def _run(self, data: Any, name: str, fn: Callable[[], None]) -> None:
        self.choices.inner = DrawChoices(data)
        self.stats.rules[f"{self.family}:{name}"] += 1
        fn()
        self._drain_events()

    def _drain_events(self) -> None:
        assert self.ls is not None
        if self.ls.config.enable_kv_cache_events:
            self._emit(O.TakeEvents())

    # --- rules ---------------------------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: Any) -> None:
        config = data.draw(configs(self.family, kv_safe=self.kv_check), label="config")
        if data.draw(st.integers(0, 3), label="watermark?") == 0:  # vLLM 0.33 KV-cache watermark
            config = dataclasses.replace(config, watermark=data.draw(st.sampled_from([0.1, 0.25, 0.4]), label="watermark"))
        sc = data.draw(sched_configs(config), label="scheduler")
        if self.kv_check and any(g.kind != "full" for g in config.groups):
            sc = dataclasses.replace(sc, full_async_loads=False, window_load_recovery=False)
        target = type(self).target_factory()
        self.stats.target_version = str(getattr(target, "version", ""))
        self.stats.examples += 1
        self.ls = Lockstep(config, target, self.relation, self.step_timeout)
        self._lockstep_call(self.ls.start)
        self.sched = Scheduler(sc, self._emit, self.choices, self._table)
        bs = config.scheduler_block_size
        n_prefixes = data.draw(st.integers(1, 3), label="num_prefixes")
        for _ in range(n_prefixes):
            n = data.draw(near_multiples(bs, 1, max(1, config.max_model_len - 2)), label="prefix_len")
            self.prefixes.append(tuple(data.draw(st.lists(st.sampled_from(ALPHABET), min_size=n, max_size=n), label="prefix")))

    @precondition(lambda self: self.sched is not None and len(self.sched.reqs) < MAX_LIVE_REQUESTS)
    @rule(data=st.data())
    def add_request(self, data: Any) -> None:
        assert self.sched is not None and self.ls is not None
        config = self.ls.config
        limit = max(1, data.draw(st.integers(config.max_model_len // 2, config.max_model_len - 1), label="prompt_limit"))
        bs = config.scheduler_block_size
        if self.prompts and data.draw(st.integers(0, 4), label="repeat_prompt?") == 0:
            prompt = data.draw(st.sampled_from(self.prompts), label="repeated_prompt")
            self.stats.events[f"{self.family}:repeat_prompt"] += 1
        else:
            prefix = data.draw(st.sampled_from(self.prefixes), label="prefix")[:limit]
            n_suffix = data.draw(near_multiples(bs, 0, max(0, limit - len(prefix))), label="suffix_len")
            prompt = prefix + tuple(data.draw(st.lists(st.sampled_from(ALPHABET), min_size=n_suffix, max_size=n_suffix), label="suffix"))
        prompt = prompt[:limit] or (ALPHABET[0],)
        self.prompts.append(prompt)
        features = data.draw(st.integers(0, 7), label="features")
        lora = cache_salt = None
        mm: tuple[O.MMFeatureSpec, ...] = ()
        skip = False
        if features == 1:
            lora = data.draw(st.sampled_from([("sql", "/loras/sql"), ("chat", "/loras/chat")]), label="lora")
        elif features == 2:
            cache_salt = data.draw(st.sampled_from(["tenant-a", "tenant-b"]), label="cache_salt")
        elif features == 3:
            # An item's identifier is its content hash, so it fixes its placeholder length too.
            ident = data.draw(st.sampled_from(sorted(MM_ITEM_LENGTHS)), label="mm_id")
            length = MM_ITEM_LENGTHS[ident]
            if length <= len(prompt):
                off = data.draw(st.integers(0, len(prompt) - length), label="mm_offset")
                mm = (O.MMFeatureSpec(ident, off, length),)
        elif features == 4:
            skip = True  # prompt logprobs: never reads the prefix cache
        if features in (1, 2, 3, 4):
            self.stats.events[f"{self.family}:feature_{('lora', 'cache_salt', 'mm', 'prompt_logprobs')[features - 1]}"] += 1
        op = O.AddRequest(self.sched.new_request_id(), prompt, lora=lora, mm_features=mm, cache_salt=cache_salt, skip_reading_prefix_cache=skip)
        self._run(data, "add_request", lambda: self.sched.add_request(op))  # type: ignore[union-attr]

    @precondition(lambda self: self.sched is not None and not self.sched.idle())
    @rule(data=st.data())
    def step(self, data: Any) -> None:
        assert self.sched is not None
        self._run(data, "step", self.sched.step)

    # Engine steps dominate real traffic: Hypothesis picks rules uniformly, so the step rule
    # appears three times.
    step_again = step
    step_once_more = step

    @precondition(lambda self: self.sched is not None and bool(self.sched.running))
    @rule(data=st.data())
    def finish(self, data: Any) -> None:
        assert self.sched is not None
        rid = data.draw(st.sampled_from(self.sched.running), label="finished")
        self._run(data, "finish", lambda: self.sched.finish(rid))  # type: ignore[union-attr]

    @precondition(lambda self: self.sched is not None and bool(self.sched.reqs))
    @rule(data=st.data())
    def abort(self, data: Any) -> None:
        assert self.sched is not None
        if data.draw(st.integers(0, 2), label="abort?") != 0:
            return
        rid = data.draw(st.sampled_from(sorted(self.sched.reqs)), label="aborted")
        self._run(data, "abort", lambda: self.sched.abort(rid))  # type: ignore[union-attr]

    @precondition(lambda self: self.sched is not None and bool(self.sched.loading()))
    @rule(data=st.data())
    def kv_arrives(self, data: Any) -> None:
        assert self.sched is not None
        rid = data.draw(st.sampled_from(self.sched.loading()), label="loaded")
        ok = True
        valid = 0
        r = self.sched.reqs.get(rid)
        if r is not None and data.draw(st.integers(0, 3), label="load_fails?") == 0:
            ok = False
            bs = self.sched.cfg.block_size
            # Invalid blocks: truncate at the first invalid block (0.33 _update_requests_with_invalid_blocks).
            # The worker only reports real blocks, so the first invalid one lies past any null prefix.
            # Under --kv-check windowed groups skip this: vLLM 0.33 then recomputes tokens whose
            # window blocks were already dropped (docs/findings.md).
            table = self.sched.table(rid) if self.sched.table is not None else ()
            lead = next((i for i, b in enumerate(table) if b), len(table))
            last = -(-r.num_computed // bs) - 1
            if self.sched.cfg.single_group and lead <= last and self.sched.cfg.window_load_recovery and data.draw(st.booleans(), label="invalid_blocks?"):
                valid = bs * data.draw(st.integers(lead, max(lead, last)), label="first_invalid")
                valid = min(valid, r.num_computed)
        self._run(data, "kv_arrives" if ok else "kv_load_failed", lambda: self.sched.kv_arrives(rid, ok, valid))  # type: ignore[union-attr]

    @precondition(lambda self: self.sched is not None)
    @rule(data=st.data())
    def reset_prefix_cache(self, data: Any) -> None:
        if data.draw(st.integers(0, 3), label="reset?") != 0:
            return

        def go() -> None:
            ok = self._emit(O.ResetPrefixCache())
            self.stats.events[f"{self.family}:reset_{'ok' if ok else 'refused'}"] += 1

        self._run(data, "reset_prefix_cache", go)

    def teardown(self) -> None:
        if self.sched is not None:
            for name, n in self.sched.counts.items():
                self.stats.events[f"{self.family}:{name}"] += n
        if self.ls is not None:
            self.stats.ops.update(self.ls.op_counts)


def make_machine(
    family: str,
    target_factory: Callable[[], Target],
    target_name: str,
    relation: str,
    stats: RunStats,
    step_timeout: float | None = 10.0,
    kv_check: bool = False,
) -> type[KVMachine]:
    name = f"KVMachine_{family}_{target_name.replace(':', '_').replace('.', '_')}_{relation}{'_kv' if kv_check else ''}"
    attrs = {
        "family": family,
        "target_factory": staticmethod(target_factory),
        "relation": relation,
        "stats": stats,
        "step_timeout": step_timeout,
        "kv_check": kv_check,
    }
    cls = type(name, (KVMachine,), attrs)
    return cls


def run_machine(cls: type[KVMachine], hyp_settings: settings, seed: int | None = None, shrink_seconds: int = 60) -> None:
    """Run the machine as one Hypothesis test; raises (after shrinking) on a finding.

    Shrinking is bounded by ``shrink_seconds`` (Hypothesis' own bound is 300 s, an internal
    constant with no setting; it is lowered here for the duration of the run).
    """
    from hypothesis.internal.conjecture import engine

    def factory() -> KVMachine:
        return cls()

    factory.__name__ = cls.__name__
    factory._hypothesis_internal_add_digest = cls.__name__.encode()  # type: ignore[attr-defined]
    if seed is not None:
        factory._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = shrink_seconds
    try:
        run_state_machine_as_test(factory, settings=hyp_settings)
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
