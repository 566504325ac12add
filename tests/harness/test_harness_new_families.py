"""The families that vary what the original seven never did (docs/families.md): sha256_cbor hashing,
encoder-decoder (cross attention, ``num_encoder_tokens``), the 0.20 free order, async scheduling
(``num_in_flight_tokens``), the hash-block-size override and prompt embeddings.

Each family runs spec vs spec and vLLM vs spec in the parametrized machines of
test_harness_statemachine.py / test_harness_vllm_statemachine.py (they take every family).  Here:
each new input matters (a deliberate bug in the spec target that ignores it is caught by its family,
and for the in-flight and encoder bugs not by an old family), the vLLM behaviour behind it is
checked directly, and the new operation and field survive the JSON trace form.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.harness.check.machine import RESETS_BEFORE_SKIP, RunStats, make_machine, run_machine
from kvspec.harness.check.settings import CheckSettings
from kvspec.harness.core import ops as O
from kvspec.harness.core.ops_json import op_from_json, op_to_json
from kvspec.harness.core.strict_json import TraceFormatError
from kvspec.harness.mutants.record import Patch
from kvspec.harness.mutants.spec import patched_modules
from kvspec.harness.run.catalogue import resolve
from kvspec.harness.run.profiles import profile_settings
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces.trace import Trace, dumps_trace, trace_from_json
from kvspec.harness.world.families import FAMILIES, configs, workload_features
from kvspec.harness.world.workload import embed_row, run_seeded
from kvspec.spec import request as rq
from kvspec.spec.config import AttentionSpec, KVCacheConfig, cross_attention, full_attention, sliding_window
from kvspec.spec.releases.line import FREE_ORDER_0_20
from kvspec.spec.releases.profile import BASE
from kvspec.spec.types import BlockCount, TokenCount


def cfg(num_blocks: int, groups: tuple[AttentionSpec, ...], max_model_len: int, **kw: Any) -> KVCacheConfig:
    return KVCacheConfig(BlockCount(num_blocks), groups, TokenCount(max_model_len), **kw)


NEW_FAMILIES = ("cbor", "encoder_decoder", "v0_20", "async_sched", "hash_block_override", "prompt_embeds")


def _vllm_factory() -> Callable[[], Any]:
    from kvspec.harness.targets import TargetLoadError

    try:
        return resolve("vllm").factory
    except TargetLoadError as e:
        pytest.skip(str(e))


# --- families and workload -----------------------------------------------------------------------


def test_new_families_are_listed() -> None:
    assert set(NEW_FAMILIES) <= set(FAMILIES)


@pytest.mark.parametrize(
    "family, holds",
    [
        ("cbor", lambda c: c.hash_algo == "sha256_cbor"),
        ("encoder_decoder", lambda c: not c.enable_caching and sum(g.kind == "cross" for g in c.groups) == 1),
        ("v0_20", lambda c: c.profile == FREE_ORDER_0_20),
        ("async_sched", lambda c: c.max_in_flight_tokens is not None and c.max_in_flight_tokens % 2 == 0),
        (
            "hash_block_override",
            lambda c: (
                c.hash_block_size_override is not None
                and len(c.groups) > 1
                and all(g.block_size > c.hash_block_size for g in c.groups)
            ),
        ),
        ("prompt_embeds", lambda c: c.enable_caching),
    ],
)
def test_family_draws_what_it_is_for(family: str, holds: Callable[[KVCacheConfig], bool]) -> None:
    @settings(max_examples=30, database=None, deadline=None)
    @given(configs(family))
    def check(config: KVCacheConfig) -> None:
        assert holds(config), config

    check()


def _emitted(config: KVCacheConfig, family: str, seed: int = 3, actions: int = 300) -> list[O.Op]:
    ops: list[O.Op] = []
    run_seeded(
        SpecTarget(), config, seed, actions, on_op=lambda op, out: ops.append(op), features=workload_features(family)
    )
    return ops


def test_async_scheduling_puts_tokens_in_flight() -> None:
    config = cfg(24, (sliding_window(2, 3),), 16, max_in_flight_tokens=8)
    ops = _emitted(config, "async_sched")
    in_flight = [op for op in ops if isinstance(op, O.SetNumInFlightTokens)]
    assert any(op.num_in_flight_tokens > 0 for op in in_flight)
    # Verified blocks are cached on the processed basis after each sampled token.
    assert any(isinstance(op, O.CacheBlocks) for op in ops)


def test_encoder_tokens_are_passed_on_admission_only() -> None:
    config = cfg(40, (full_attention(2), cross_attention(2)), 16, enable_caching=False)
    ops = _emitted(config, "encoder_decoder")
    computed: dict[str, int] = {}
    encoder_calls = 0
    for op in ops:
        if isinstance(op, O.SetNumComputedTokens):
            computed[op.request_id] = op.num_computed_tokens
        elif isinstance(op, O.AllocateSlots) and op.num_encoder_tokens:
            assert computed.get(op.request_id, 0) == 0, "encoder inputs are scheduled before any decoder token"
            encoder_calls += 1
    assert encoder_calls > 0


def test_prompt_embeds_requests_have_zero_token_ids() -> None:
    config = cfg(24, (full_attention(2),), 16)
    adds = [op for op in _emitted(config, "prompt_embeds", actions=400) if isinstance(op, O.AddRequest)]
    embedded = [op for op in adds if op.prompt_embeds is not None]
    assert embedded and all(set(op.prompt_token_ids) == {0} for op in embedded)
    assert all(len(op.prompt_embeds or ()) == len(op.prompt_token_ids) for op in embedded)


@pytest.mark.parametrize("family", ["full", "sliding_window", "hybrid_equal", "events", "no_cache"])
def test_old_families_emit_none_of_the_new_inputs(family: str) -> None:
    """The new inputs are drawn only by their families: old seeds replay the same operations."""
    rng = random.Random(5)
    config = cfg(30, (sliding_window(2, 3),) if family == "sliding_window" else (full_attention(2),), 16)
    ops = _emitted(config, family, seed=rng.randrange(100))
    assert not any(isinstance(op, O.SetNumInFlightTokens) for op in ops)
    assert not any(op.prompt_embeds is not None for op in ops if isinstance(op, O.AddRequest))
    assert not any(isinstance(op, O.AllocateSlots) and op.num_encoder_tokens for op in ops)


# --- the JSON trace form ---------------------------------------------------------------------------


def test_new_op_and_field_round_trip() -> None:
    rows = tuple(embed_row(t) for t in (1, 2, 3))
    for op in (O.AddRequest("r1", (0, 0, 0), prompt_embeds=rows), O.SetNumInFlightTokens("r1", 5)):
        assert op_from_json(op_to_json(op)) == op
    # Without embeddings the field is left out, so older traces and readers are unaffected.
    assert "prompt_embeds" not in op_to_json(O.AddRequest("r1", (1,)))
    old = op_from_json({"op": "add_request", "request_id": "r1", "prompt_token_ids": [1]})
    assert isinstance(old, O.AddRequest) and old.prompt_embeds is None


@pytest.mark.parametrize(
    "obj, says",
    [
        ({"op": "add_request", "request_id": "r", "prompt_token_ids": [0], "prompt_embeds": "00000000"}, "list of hex"),
        ({"op": "add_request", "request_id": "r", "prompt_token_ids": [0], "prompt_embeds": [7]}, "list of hex"),
        ({"op": "add_request", "request_id": "r", "prompt_token_ids": [0], "prompt_embeds": ["xyz0"]}, "not a hex"),
        ({"op": "add_request", "request_id": "r", "prompt_token_ids": [0], "prompt_embeds": ["000000"]}, "float32"),
        (
            {
                "op": "add_request",
                "request_id": "r",
                "prompt_token_ids": [0, 0],
                "prompt_embeds": ["00000000", "0000000000000000"],
            },
            "width",
        ),
        (
            {"op": "add_request", "request_id": "r", "prompt_token_ids": [0, 0], "prompt_embeds": ["00000000"]},
            "1 prompt_embeds rows for 2",
        ),
        ({"op": "set_num_in_flight_tokens", "request_id": "r", "num_in_flight_tokens": "3"}, "expected an int"),
        ({"op": "set_num_in_flight_tokens", "request_id": "r", "num_in_flight_tokens": True}, "expected an int"),
        ({"op": "set_num_in_flight_tokens", "request_id": "r", "num_in_flight_tokens": -1}, ">= 0"),
        ({"op": "set_num_in_flight_tokens", "num_in_flight_tokens": 1}, "missing field 'request_id'"),
    ],
)
def test_bad_new_fields_are_rejected(obj: dict[str, Any], says: str) -> None:
    with pytest.raises(TraceFormatError, match=says):
        op_from_json(obj)


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_trace_of_each_new_family_round_trips(family: str) -> None:
    """A trace written by a run of the family (config and operations) reads back equal."""

    @settings(max_examples=3, database=None, deadline=None)
    @given(configs(family), st.integers(0, 1000))
    def check(config: KVCacheConfig, seed: int) -> None:
        steps: list[tuple[O.Op, Any]] = []
        run_seeded(
            SpecTarget(),
            config,
            seed,
            60,
            on_op=lambda op, out: steps.append((op, out)),
            features=workload_features(family),
        )
        trace = Trace(config=config, steps=steps, target_name="spec", target_version="x", seed=seed, family=family)
        import json

        back = trace_from_json(json.loads(dumps_trace(trace)))
        assert back.config == config and [op for op, _ in back.steps] == [op for op, _ in steps]

    check()


# --- deliberate bugs: each family catches the mistake about its input ---------------------------


class _Buggy(SpecTarget):
    """The spec target with one patched spec function (as harness.mutants.spec does) or hook."""

    patch: Patch | None = None

    def apply(self, op: O.Op) -> Any:
        if self.patch is None:
            return super().apply(op)
        with patched_modules(self.patch):
            return super().apply(op)


class _IgnoresInFlight(_Buggy):
    """Frees window blocks on the optimistic count, as if no step were in flight."""

    patch = Patch(
        "kvspec.spec.slot_allocation",
        "get_num_processed_tokens",
        lambda orig: lambda request, t: t.total_computed_tokens,
    )


class _IgnoresEncoderTokens(_Buggy):
    """Never allocates cross-attention blocks."""

    patch = Patch(
        "kvspec.spec.kv_cache_manager",
        "allocate_slots",
        lambda orig: lambda *a, **kw: orig(*a, **{**kw, "num_encoder_tokens": 0}),
    )


class _V033FreeOrder(_Buggy):
    """Follows the 0.33 free order whatever the profile."""

    patch = Patch(
        "kvspec.spec.block_pool",
        "free_blocks",
        lambda orig: (
            lambda pool, blocks, *args: dataclasses.replace(
                orig(dataclasses.replace(pool, profile=BASE), blocks, *args), profile=pool.profile
            )
        ),
    )


class _HashesWith(SpecTarget):
    """Builds requests as if the config had ``changes`` (a hashing knob ignored)."""

    changes: dict[str, Any] = {}

    def new_request(self, r: Any) -> rq.Request:
        real = self.config
        assert real is not None
        self.config = dataclasses.replace(real, **self.changes)
        try:
            return super().new_request(r)
        finally:
            self.config = real


class _IgnoresHashAlgo(_HashesWith):
    changes = {"hash_algo": "sha256"}


class _IgnoresOverride(_HashesWith):
    changes = {"hash_block_size_override": None}


def _caught(family: str, factory: Callable[[], Any], max_examples: int, seed: int = 1) -> RunStats:
    stats = RunStats()
    cls = make_machine(family, factory, f"buggy_{factory.__name__}", CheckSettings(), stats)
    try:
        run_machine(cls, profile_settings("dev", max_examples=max_examples, database=None), seed=seed, shrink_seconds=2)
    except Exception:
        pass
    return stats


@pytest.mark.parametrize(
    "family, factory",
    [
        ("async_sched", _IgnoresInFlight),
        ("encoder_decoder", _IgnoresEncoderTokens),
        ("v0_20", _V033FreeOrder),
        ("cbor", _IgnoresHashAlgo),
        ("hash_block_override", _IgnoresOverride),
    ],
)
def test_family_catches_the_bug_about_its_input(family: str, factory: Callable[[], Any]) -> None:
    stats = _caught(family, factory, 200)
    assert stats.finding is not None and stats.finding.kind == "divergence", f"{family} missed {factory.__name__}"


@pytest.mark.full  # 10-16 s each: the controls of test_family_catches_the_bug_about_its_input
@pytest.mark.parametrize("family, factory", [("sliding_window", _IgnoresInFlight), ("full", _IgnoresEncoderTokens)])
def test_old_family_cannot_see_the_bug(family: str, factory: Callable[[], Any]) -> None:
    """Without the new family the mistake goes unnoticed (the input never varies there)."""
    assert _caught(family, factory, 12).finding is None  # 12 examples: the input never varies, so more add nothing


# --- what vLLM 0.33 does with each input ---------------------------------------------------------


def _pair() -> list[Any]:
    return [_vllm_factory()(), SpecTarget()]


def _run(target: Any, config: KVCacheConfig, ops: list[O.Op]) -> list[Any]:
    target.reset(config)
    return [target.apply(op) for op in ops]


def _admit(rid: str, n: int) -> list[O.Op]:
    """Look up, allocate ``n`` tokens (caching the full blocks) and count them computed."""
    return [
        O.GetComputedBlocks(rid),
        O.AllocateSlots(rid, n, use_computed_blocks=True),
        O.SetStatus(rid, "RUNNING"),
        O.SetNumComputedTokens(rid, n),
    ]


@pytest.mark.vllm
def test_prompt_embeds_separate_equal_token_prompts_in_vllm() -> None:
    """Two embeddings-only prompts (token ids all 0) share cached blocks only if their embeddings
    are equal; a token prompt of zeros shares nothing with them."""
    config = cfg(32, (full_attention(2),), 16)
    a, b = tuple(embed_row(t) for t in (1, 2, 3, 1, 2)), tuple(embed_row(t) for t in (1, 2, 3, 3, 2))
    ops: list[O.Op] = [O.AddRequest("a", (0,) * 5, prompt_embeds=a), *_admit("a", 5)]
    ops += [O.AddRequest(rid, (0,) * 5, prompt_embeds=e) for rid, e in (("same", a), ("other", b), ("tokens", None))]
    ops += [O.GetComputedBlocks(rid) for rid in ("same", "other", "tokens")]
    vllm, spec = _pair()
    hits = [out["num_hit_tokens"] for out in _run(vllm, config, ops)[-3:]]
    assert hits == [4, 2, 0]  # 'other' differs from block 1 on (positions 2-3)
    assert [out["num_hit_tokens"] for out in _run(spec, config, ops)[-3:]] == hits


@pytest.mark.vllm
def test_sha256_cbor_hashes_equal_vllms() -> None:
    """Block hashes under sha256_cbor (and their event form) agree with vLLM for every feature the
    spec hashes; the embeddings case is checked on spec.hashing directly (see conftest gap 2)."""
    from kvspec.spec.hashing import HashFeatures, extend_block_hashes

    config = cfg(32, (full_attention(2),), 16, hash_algo="sha256_cbor", enable_kv_cache_events=True)
    adds = [
        O.AddRequest("plain", (1, 2, 3, 1, 2)),
        O.AddRequest("lora", (1, 2, 3, 1), lora=("sql", "/loras/sql")),
        O.AddRequest("mm", (1, 2, 3, 1, 2, 3), mm_features=(O.MMFeatureSpec("img-a", 1, 2),)),
        O.AddRequest("salt", (1, 2, 3, 1), cache_salt="tenant-a"),
        O.AddRequest("embeds", (0, 0, 0, 0), prompt_embeds=tuple(embed_row(t) for t in (1, 2, 3, 1))),
    ]
    ops: list[O.Op] = [*adds, *_admit("plain", 5), O.TakeEvents()]
    vllm, spec = _pair()
    v_out, s_out = _run(vllm, config, ops), _run(spec, config, ops)
    assert v_out[-1] == s_out[-1] and v_out[-1], "BlockStored events (with their hashes) differ"
    v_hashes, s_hashes = vllm.observe().request_block_hashes, spec.observe().request_block_hashes
    for rid in ("plain", "lora", "mm", "salt"):
        assert v_hashes[rid] == s_hashes[rid], rid
    rows = adds[-1].prompt_embeds_rows()
    features = HashFeatures(prompt_embeds=rows)
    expected = extend_block_hashes((), (0, 0, 0, 0), features, 2, "sha256_cbor", rq.PROCESS_HASH_SEED)
    assert v_hashes["embeds"] == expected


@pytest.mark.vllm
def test_in_flight_tokens_keep_window_blocks_in_vllm() -> None:
    """vLLM 0.33 frees sliding-window blocks on the processed basis: with the last step's tokens
    still in flight the block that just left the window is kept; spec and vLLM agree either way."""
    config = cfg(32, (sliding_window(2, 2),), 32, max_in_flight_tokens=8)
    ops: list[O.Op] = [O.AddRequest("r", (1, 2, 3, 1, 2, 3, 1, 2)), *_admit("r", 4)]
    ops += [O.AllocateSlots("r", 4), O.SetNumComputedTokens("r", 8)]
    tables = []
    for in_flight in (0, 4):
        step: list[O.Op] = [O.SetNumInFlightTokens("r", in_flight), O.AllocateSlots("r", 1)]
        vllm, spec = _pair()
        _run(vllm, config, ops + step)
        _run(spec, config, ops + step)
        assert vllm.observe().tables == spec.observe().tables
        tables.append(vllm.observe().tables[0]["r"])
    assert tables[0].count(0) > tables[1].count(0), tables  # fewer null (freed) positions in flight


@pytest.mark.vllm
def test_encoder_tokens_allocate_cross_blocks_once_in_vllm() -> None:
    config = cfg(32, (full_attention(2), cross_attention(2)), 16, enable_caching=False)
    enc = (O.MMFeatureSpec("audio-5", 0, 5),)
    ops: list[O.Op] = [
        O.AddRequest("r", (1, 2, 3), mm_features=enc),
        O.GetComputedBlocks("r"),
        O.AllocateSlots("r", 3, use_computed_blocks=True, num_encoder_tokens=5),
        O.SetStatus("r", "RUNNING"),
        O.SetNumComputedTokens("r", 3),
        O.AppendOutputTokens("r", (1,)),
        O.AllocateSlots("r", 1),
    ]
    vllm, spec = _pair()
    v_out, s_out = _run(vllm, config, ops), _run(spec, config, ops)
    assert v_out == s_out
    assert [len(g) for g in v_out[2]["block_ids"]] == [2, 3]  # 3 decoder tokens, 5 encoder tokens
    assert v_out[-1]["block_ids"][1] == []  # later steps add no cross blocks


@pytest.mark.vllm
def test_v0_20_is_skipped_cleanly_on_vllm() -> None:
    stats = RunStats()
    cls = make_machine("v0_20", _vllm_factory(), "vllm", CheckSettings(), stats)
    run_machine(cls, profile_settings("dev", max_examples=5, database=None), seed=1)
    assert "v0_20" in stats.skipped and "0.20" in stats.skipped["v0_20"]
    assert stats.events["v0_20:unsupported_at_reset"] == 1 and stats.examples == 0
    assert cls.resets.refused == RESETS_BEFORE_SKIP  # skipped at the bound, not after Hypothesis gives up
    run_machine(cls, profile_settings("dev", max_examples=5, database=None), seed=2)  # not run again
    assert stats.events["v0_20:unsupported_at_reset"] == 1


@pytest.mark.parametrize("family", ["v0_20", "cbor", "encoder_decoder", "hash_block_override", "async_sched"])
def test_impl_runs_the_new_families(family: str, machine_run: Any) -> None:
    from kvspec.harness.targets.impl import ImplTarget

    stats = machine_run(family, ImplTarget, "impl", examples=10, seed=3, shrink_seconds=5)
    assert stats.examples > 0
