"""A stub KV connector for the real scheduler: the scheduler side of a P/D consumer.

A request whose ``kv_transfer_params`` carry ``{"load": n}`` has its tokens up to ``n`` available
remotely; they load asynchronously unless ``"sync": True`` (then at most ``num_tokens - 1``).
The driver (``harness.vllm_sched.driver``)
completes a load by reporting the request in ``KVConnectorOutput.finished_recving`` (or fails it with
``invalid_block_ids``).  Written against vLLM 0.33.0's connector base API; no worker side.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA


class StubConnector(KVConnectorBase_V1, SupportsHMA):
    """Loads ``kv_transfer_params["load"]`` tokens of a request (async unless ``"sync"``); keeps the
    external tokens the scheduler allocated for each request's latest load (``loaded``), as a
    worker knows which blocks it writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        load = int(params.get("load", 0))
        sync = bool(params.get("sync", False))
        if sync:  # a synchronous load leaves the last token to compute (the scheduler asserts it)
            load = min(load, request.num_tokens - 1)
        count = max(0, load - num_computed_tokens)
        return count, count > 0 and not sync

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.loaded[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        return KVConnectorMetadata()

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass
