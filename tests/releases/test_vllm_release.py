"""The vllm target's release probe (harness/targets/vllm_release.py), without vLLM: the shapes it
reads, and what it says about a release kvspec does not model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from kvspec.harness.run.options import from_environ
from kvspec.harness.targets.vllm_observe import Reader
from kvspec.harness.targets.vllm_release import (
    ANY,
    ASSUME_ENV,
    ReleaseMismatch,
    installed_profile,
    probe,
    seed_none_hash,
    split_computed,
)
from kvspec.spec.hashing import get_hash_fn, get_none_hash
from kvspec.spec.releases.line import UnknownRelease, profile_for
from kvspec.spec.request import PROCESS_HASH_SEED


@dataclass(slots=True)
class Block033:  # up to 0.33: private hash fields behind properties
    block_id: int
    _block_hash: bytes | None = None
    _block_hash_num_tokens: int | None = None


@dataclass(slots=True)
class Block034:  # 0.34: plain fields
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None


@dataclass(slots=True)
class Block023:  # 0.23: no partial keys, so no token count
    block_id: int
    _block_hash: bytes | None = None


class Map033:
    def __init__(self) -> None: ...


class Map034:
    def __init__(self, blocks: list[object]) -> None: ...


class Manager:
    def __init__(self, kv_cache_config: object, max_model_len: int, max_num_batched_tokens: int = 0) -> None: ...

    def allocate_slots(self, request: object, num_new_tokens: int, reserved_blocks: int = 0) -> None: ...


@dataclass
class Sampling033:
    prompt_logprobs: int | None = None


@dataclass
class Sampling034:
    prompt_logprobs: int | None = None
    prompt_logprob_start: int | None = None


def test_probe_reads_each_release_shape() -> None:
    old = probe("0.33.0", Manager, Block033, Map033, Sampling033)
    new = probe("0.34.0", Manager, Block034, Map034, Sampling034)
    oldest = probe("0.23.0", Manager, Block023, Map033, Sampling033)
    assert (old.hash_attr, old.hash_tokens_attr, old.map_holds_ids, old.logprob_start) == (
        "_block_hash",
        "_block_hash_num_tokens",
        False,
        False,
    )
    assert (new.hash_attr, new.hash_tokens_attr, new.map_holds_ids, new.logprob_start) == (
        "block_hash",
        "block_hash_num_tokens",
        True,
        True,
    )
    assert oldest.hash_tokens_attr is None
    assert new.profile == profile_for("0.34.0") and old.profile == profile_for("0.33.0")
    assert old.manager_params == {"kv_cache_config", "max_model_len", "max_num_batched_tokens"}


def test_keywords_a_release_lacks_pass_only_at_their_default() -> None:
    api = probe("0.33.0", Manager, Block033, Map033, Sampling033)
    wanted = {"max_model_len": 8, "watermark": 0.0, "max_in_flight_tokens": None}
    defaults = {"watermark": 0.0, "max_in_flight_tokens": None}
    assert api.manager_kwargs(wanted, defaults) == {"max_model_len": 8}
    with pytest.raises(ReleaseMismatch, match="has no 'watermark'"):
        api.manager_kwargs({**wanted, "watermark": 0.25}, defaults)
    with pytest.raises(ReleaseMismatch, match="has no 'full_sequence_must_fit'"):
        api.allocate_kwargs({"full_sequence_must_fit": True}, {})
    assert api.allocate_kwargs({"has_scheduled_reqs": False, "reserved_blocks": 2}, {"has_scheduled_reqs": ANY}) == {
        "reserved_blocks": 2
    }


def test_get_computed_blocks_arity() -> None:
    assert split_computed(("blocks", 4)) == ("blocks", 4)
    assert split_computed(("blocks", 4, 0)) == ("blocks", 4)


def test_an_unknown_release_is_refused_with_the_way_to_check_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ASSUME_ENV, "0.34.0")  # read at the edges into the options, not here
    with pytest.raises(UnknownRelease) as e:
        installed_profile("0.35.0")
    assert "nearest: 0.34.0" in str(e.value)
    assert f"{ASSUME_ENV}=<release> kvspec fuzz --target vllm --relation invariants" in str(e.value)
    assert installed_profile("0.35.0", assumed="0.34.0") == profile_for("0.34.0")
    with pytest.raises(UnknownRelease):
        installed_profile("0.35.0", assumed="0.99.0")
    assert from_environ({ASSUME_ENV: " 0.34.0 "})["assume_release"] == "0.34.0"  # what the CLI passes


def test_an_override_that_contradicts_a_known_installed_release_is_refused() -> None:
    """A stale KVSPEC_VLLM_PROFILE=0.34.0 with 0.33.0 installed would make every 0.34 change a false
    finding: refused, saying why; assuming a known release's own profile is harmless."""
    with pytest.raises(UnknownRelease, match="kvspec knows 0.33.0 itself"):
        installed_profile("0.33.0", assumed="0.34.0")
    assert installed_profile("0.33.0", assumed="0.33.0") == profile_for("0.33.0")


class Manager026:  # 0.26 on: the admission cap's token count under its new name
    def __init__(self, kv_cache_config: object, max_model_len: int, max_in_flight_tokens: int | None = None) -> None:
        pass

    def allocate_slots(self, request: object, num_new_tokens: int) -> None: ...


def test_max_in_flight_tokens_goes_under_its_old_name() -> None:
    """0.23-0.25 call the admission cap's token count ``max_num_batched_tokens`` (the same role, the
    same arithmetic; None means ``max_model_len`` in both): a set value goes there, the default is
    left to the release; 0.26 on take ``max_in_flight_tokens`` itself."""
    old = probe("0.25.0", Manager, Block023, Map033, Sampling033)
    assert old.manager_renames == {"max_in_flight_tokens": "max_num_batched_tokens"}
    wanted = {"max_model_len": 64, "max_in_flight_tokens": 48}
    defaults = {"max_in_flight_tokens": None}
    assert old.manager_kwargs(wanted, defaults) == {"max_model_len": 64, "max_num_batched_tokens": 48}
    assert old.manager_kwargs({**wanted, "max_in_flight_tokens": None}, defaults) == {"max_model_len": 64}
    new = probe("0.26.0", Manager026, Block033, Map033, Sampling033)
    assert new.manager_renames == {}
    assert new.manager_kwargs(wanted, defaults) == wanted


def _kv_cache_utils(random: bool) -> SimpleNamespace:
    """A stand-in ``kv_cache_utils`` whose ``init_none_hash`` draws at random (0.23-0.28 with
    ``PYTHONHASHSEED`` unset: ``os.urandom(32)``) or hashes a seed."""
    utils = SimpleNamespace(NONE_HASH=None)

    def init_none_hash(hash_fn: Any) -> None:
        utils.NONE_HASH = os.urandom(32) if random else hash_fn("some seed")

    utils.init_none_hash = init_none_hash
    return utils


def test_a_random_none_hash_is_replaced_by_the_spec_value() -> None:
    """A release drawing ``NONE_HASH`` at random gets the value the spec hashes from; a deterministic
    one keeps its own (a wrong seed there must still show as a divergence)."""
    fn = get_hash_fn("sha256")
    spec_value = get_none_hash("sha256", PROCESS_HASH_SEED)
    utils = _kv_cache_utils(random=True)
    assert seed_none_hash(utils, fn, spec_value) == spec_value == utils.NONE_HASH
    fixed = _kv_cache_utils(random=False)
    assert seed_none_hash(fixed, fn, spec_value) == fn("some seed") == fixed.NONE_HASH


def test_key_tokens_come_from_the_adapter_where_blocks_lack_them() -> None:
    """0.23's ``KVCacheBlock`` has no ``_block_hash_num_tokens``: the reader asks the adapter's
    ``key_tokens`` (key -> tokens, from the request hashes it saw) instead of reporting None where
    the spec has a count."""
    api = probe("0.23.0", Manager, Block023, Map033, Sampling033)
    blk = Block023(1, b"k" * 36)
    assert Reader(api, lambda key: 8 if key == b"k" * 36 else None).block_key_tokens(blk) == 8
    assert Reader(api).block_key_tokens(blk) is None
