"""vLLM bug: a LoRA adapter loaded again under the same name from the same path (its files replaced
with new weights) reuses the prefix-cache blocks computed with the previous weights
(docs/upstream/lora-reload-same-path.md).

Two parts, both on vLLM's own classes:

- what the OpenAI server does on a reload (``OpenAIServingModels`` with a recording engine client):
  loading a loaded name again is refused unless ``load_inplace``; an in-place load keeps the
  ``lora_int_id`` (0.31.0 and later log a warning that the old blocks stay valid); an unload only
  forgets the name, and the next load gets a new ``lora_int_id`` and no warning.  Neither path asks
  the engine for anything but ``add_lora``: no ``remove_lora``, no ``reset_prefix_cache``.
- what the KV-cache manager does with the requests those loads produce (the real ``Scheduler`` on
  CPU): the block keys hold the adapter's name and path only (``_gen_lora_extra_hash_keys``), so a
  prompt sent to the reloaded adapter hits every full block that the same prompt left under the old
  load, whichever ``lora_int_id`` the reload got.

Checked on the released wheels 0.23.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0 and 0.34.0: the same on each,
except that before 0.31.0 the key held the name only and there was no warning.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("einops", reason="vLLM's ModelConfig imports einops to inspect the model architecture")

from packaging.version import Version  # noqa: E402
from upstream_vllm import BLOCK, VLLM_VERSION, full, scheduler, vllm_config  # noqa: E402
from vllm.entrypoints.openai.models.protocol import BaseModelPath  # noqa: E402
from vllm.entrypoints.openai.models.serving import OpenAIServingModels  # noqa: E402
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

NAME = "support-bot"
PATH = "/adapters/support-bot"  # the files at this path are replaced between the loads
PROMPT = list(range(1, 2 * BLOCK + 2))  # two full blocks and one token
LAST_AFFECTED = Version("0.34.0")
WARNS_IN_PLACE = VLLM_VERSION >= Version("0.31.0")


class RecordingEngineClient:
    """The engine client the OpenAI server talks to: records every call, accepts every adapter."""

    def __init__(self) -> None:
        self.model_config = vllm_config().model_config
        self.renderer = None
        self.input_processor = None
        self.calls: list[tuple[str, Any]] = []

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        self.calls.append(("add_lora", lora_request.lora_int_id))
        return True

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return True

        return call


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def reload_through_server() -> dict[str, Any]:
    """Load, load again (refused), load in place, unload, load: what each step gives and logs."""
    engine = RecordingEngineClient()
    models = OpenAIServingModels(engine, [BaseModelPath(name="base", model_path="base")])
    log = logging.getLogger("vllm.entrypoints.openai.models.serving")
    captured = Captured()
    log.addHandler(captured)
    # Another test may have quietened vLLM's loggers (``logging.getLogger("vllm").setLevel(ERROR)``):
    # this logger's own level makes its warnings reach the handler whatever its parents say.
    level = log.level
    log.setLevel(logging.WARNING)
    out: dict[str, Any] = {"engine": engine}

    async def flow() -> None:
        def load(inplace: bool) -> Any:
            return models.load_lora_adapter(
                LoadLoRAAdapterRequest(lora_name=NAME, lora_path=PATH, load_inplace=inplace)
            )

        assert isinstance(await load(False), str)
        out["first"] = models.lora_requests[NAME]
        again = await load(False)
        out["again_code"] = again.error.code
        start = len(captured.messages)
        assert isinstance(await load(True), str)
        out["in_place"] = models.lora_requests[NAME]
        out["in_place_warnings"] = captured.messages[start:]
        calls = len(engine.calls)
        assert isinstance(await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=NAME)), str)
        out["unload_calls"] = engine.calls[calls:]
        start = len(captured.messages)
        assert isinstance(await load(False), str)
        out["reloaded"] = models.lora_requests[NAME]
        out["reload_warnings"] = captured.messages[start:]

    try:
        asyncio.run(flow())
    finally:
        log.removeHandler(captured)
        log.setLevel(level)
    return out


def lora_request(rid: str, lora: LoRARequest) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=PROMPT,
        sampling_params=SamplingParams(max_tokens=4),
        pooling_params=None,
        lora_request=lora,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def hit_after_reload(old: LoRARequest, new: LoRARequest) -> int:
    """The old load computes PROMPT and finishes; the same prompt to the new load: tokens it hits."""
    sched = scheduler(full())
    sched.add_request(lora_request("old", old))
    first = sched.schedule()
    assert first.num_scheduled_tokens["old"] == len(PROMPT)
    sched.finish_requests("old", RequestStatus.FINISHED_ABORTED)  # blocks freed, still cached
    sched.add_request(lora_request("new", new))
    (started,) = [r for r in sched.schedule().scheduled_new_reqs if r.req_id == "new"]
    return started.num_computed_tokens


def test_server_reload_keeps_or_renews_the_id_and_never_touches_the_cache() -> None:
    out = reload_through_server()
    first, in_place, reloaded = out["first"], out["in_place"], out["reloaded"]
    assert out["again_code"] == 400  # a loaded name is refused without load_inplace
    assert (in_place.lora_name, in_place.lora_path) == (first.lora_name, first.lora_path)
    assert in_place.lora_int_id == first.lora_int_id  # in place: the same id
    assert (reloaded.lora_name, reloaded.lora_path) == (first.lora_name, first.lora_path)
    assert reloaded.lora_int_id != first.lora_int_id  # after an unload: a new id
    assert out["unload_calls"] == []  # unload tells the engine nothing
    assert {name for name, _ in out["engine"].calls} == {"add_lora"}  # no reset_prefix_cache
    assert any("not invalidated" in m for m in out["in_place_warnings"]) == WARNS_IN_PLACE
    assert out["reload_warnings"] == []  # unload + load from the same path: silent


@pytest.mark.xfail(
    VLLM_VERSION <= LAST_AFFECTED,
    reason="LoRA block keys hold the adapter's name and path only: a reload from the same path reuses "
    "the old weights' KV (docs/upstream/lora-reload-same-path.md)",
    strict=True,
)
@pytest.mark.parametrize("how", ["in_place", "reloaded"])
def test_reloaded_adapter_does_not_hit_blocks_of_the_previous_load(how: str) -> None:
    out = reload_through_server()
    old, new = out["first"], out[how]
    same_keys = lora_request("a", old).block_hashes == lora_request("b", new).block_hashes
    hit = hit_after_reload(old, new)
    assert hit == 0, f"the reload hit {hit} tokens of the previous load's KV (same block hashes: {same_keys})"


def test_other_path_does_not_hit() -> None:
    """Control: the same name loaded from another path gets no hit (0.31.0 and later)."""
    if VLLM_VERSION < Version("0.31.0"):
        pytest.skip("before 0.31.0 the key held the adapter's name only")
    old = LoRARequest(NAME, 1, PATH)
    assert hit_after_reload(old, LoRARequest(NAME, 2, PATH + "-v2")) == 0
    assert hit_after_reload(old, LoRARequest(NAME, 1, PATH)) == 2 * BLOCK  # and a true repeat hits
