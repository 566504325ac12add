"""harness.targets.vllm_release: the adapter's probes of the installed release, on stand-in classes
shaped like the releases' (no vLLM needed).  The shapes are those of vLLM 0.23-0.25 (the manager's
``max_num_batched_tokens``; ``init_none_hash`` drawing ``os.urandom(32)`` when ``PYTHONHASHSEED`` is
unset, up to 0.28) and of 0.26 on."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from harness.targets.vllm_observe import Reader
from harness.targets.vllm_release import ReleaseMismatch, probe, seed_none_hash
from spec.hashing import get_hash_fn, get_none_hash
from spec.request import PROCESS_HASH_SEED


class Manager025:
    def __init__(self, kv_cache_config: Any, max_model_len: int, max_num_batched_tokens: int | None = None) -> None: ...

    def allocate_slots(self, request: Any, num_new_tokens: int) -> None: ...


class Manager026:
    def __init__(self, kv_cache_config: Any, max_model_len: int, max_in_flight_tokens: int | None = None) -> None: ...

    def allocate_slots(self, request: Any, num_new_tokens: int) -> None: ...


class Block023:
    __slots__ = ("block_id", "ref_cnt", "_block_hash")


class Map:
    def __init__(self) -> None: ...


class Sampling:
    __dataclass_fields__: dict[str, object] = {}


def test_max_in_flight_tokens_is_passed_under_its_old_name() -> None:
    """0.23-0.25 call the admission cap's token count ``max_num_batched_tokens``: the same value goes
    there; 0.26 on take ``max_in_flight_tokens`` itself."""
    old = probe("0.25.0", Manager025, Block023, Map, Sampling)
    assert old.manager_renames == {"max_in_flight_tokens": "max_num_batched_tokens"}
    wanted = {"max_model_len": 64, "max_in_flight_tokens": 48}
    defaults = {"max_in_flight_tokens": None}
    assert old.manager_kwargs(wanted, defaults) == {"max_model_len": 64, "max_num_batched_tokens": 48}
    new = probe("0.26.0", Manager026, Block023, Map, Sampling)
    assert new.manager_renames == {}
    assert new.manager_kwargs(wanted, defaults) == wanted
    with pytest.raises(ReleaseMismatch):
        old.manager_kwargs({"watermark": 0.5}, {"watermark": 0.0})


def _utils(random: bool) -> SimpleNamespace:
    """A stand-in ``kv_cache_utils`` whose ``init_none_hash`` draws at random or hashes a seed."""
    utils = SimpleNamespace(NONE_HASH=None)

    def init_none_hash(hash_fn: Any) -> None:
        utils.NONE_HASH = os.urandom(32) if random else hash_fn("some seed")

    utils.init_none_hash = init_none_hash
    return utils


def test_random_none_hash_is_replaced_by_the_spec_value() -> None:
    """A release drawing ``NONE_HASH`` at random gets the value the spec derives; a deterministic one
    keeps its own (a wrong seed there must still show as a divergence)."""
    fn = get_hash_fn("sha256")
    spec_value = get_none_hash("sha256", PROCESS_HASH_SEED)
    utils = _utils(random=True)
    assert seed_none_hash(utils, fn, spec_value) == spec_value == utils.NONE_HASH
    fixed = _utils(random=False)
    assert seed_none_hash(fixed, fn, spec_value) == fn("some seed") == fixed.NONE_HASH


def test_key_tokens_come_from_the_adapter_where_blocks_lack_them() -> None:
    """0.23's ``KVCacheBlock`` has no ``_block_hash_num_tokens``: the reader asks the adapter's
    ``key_tokens`` (key -> tokens) instead of reporting None where the spec has a count."""
    api = probe("0.23.0", Manager025, Block023, Map, Sampling)
    assert api.hash_tokens_attr is None
    blk = SimpleNamespace(_block_hash=b"k" * 36)
    assert Reader(api, lambda key: 8 if key == b"k" * 36 else None).block_key_tokens(blk) == 8
    assert Reader(api).block_key_tokens(blk) is None
