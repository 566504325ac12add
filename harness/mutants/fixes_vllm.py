"""The proposed fixes of the known vLLM 0.33 bugs (``harness.ledger.known_bugs``), applied at run time.

``--target vllm-fixed`` is the installed vLLM 0.33.0 ``KVCacheManager`` with the manager-level
fixes of docs/upstream/ active inside each call (monkeypatched on the class for the call and
restored after it, as ``harness.mutants.vllm`` does for deliberate bugs; no vLLM code is copied):

- K1 (``window_full_remote_load``): the window managers keep one more trailing token, as vLLM's own
  ``extra_retained_tokens >= 1`` would, so a request resumed by recomputing its last token still
  holds that token's window (``retain_one_more_sliding`` / ``retain_one_more_chunked``);
- K3 (``chunk_not_block_multiple``): a chunked-local group whose chunk is not a multiple of its block
  size is refused at start-up (``reset`` raises ``Unsupported``, as a config error would).

K2 (``window_invalid_block_recovery``) is fixed in the scheduler (recompute from scratch when the
window of the first recomputed token is no longer held), not in the manager: the manager-level
workload keeps vLLM 0.33's recovery, so ``vllm-fixed`` still shows K2; its fix is checked on the
real scheduler (tests/upstream/test_invalid_block_recovery_window.py).

The fixed manager departs from 0.33 on purpose (one more block held per window group), so it is
checked with ``--relation invariants`` (the spec's invariants and the KV ledger on its own state),
not against the spec: ``kvspec fuzz --target vllm-fixed --relation invariants``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.vllm import VllmTarget
from kvspec.spec.config import KVCacheConfig

FIXED = ("K1", "K3")


def retain_one_more_sliding(self: Any, num_computed_tokens: int) -> int:
    """K1 fix, sliding window: skip the tokens before the window of token ``num_computed_tokens - 1``
    (one trailing token more than 0.33 keeps, or vLLM's ``extra_retained_tokens`` if larger)."""
    extra = max(int(self.extra_retained_tokens), 1)
    return max(0, num_computed_tokens - int(self.sliding_window) + 1 - extra)


def retain_one_more_chunked(self: Any, num_computed_tokens: int) -> int:
    """K1 fix, chunked local: skip the chunks before the chunk of token ``num_computed_tokens - 1``."""
    chunk = int(self.attention_chunk_size)
    return max(0, num_computed_tokens - 1) // chunk * chunk


@contextmanager
def fixes_applied() -> Iterator[None]:
    """vLLM's window managers with the K1 fix, restored on exit."""
    from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager, SlidingWindowManager

    patches = (
        (SlidingWindowManager, retain_one_more_sliding),
        (ChunkedLocalAttentionManager, retain_one_more_chunked),
    )
    originals = [(cls, cls.__dict__["get_num_skipped_tokens"]) for cls, _ in patches]
    for cls, fix in patches:
        setattr(cls, "get_num_skipped_tokens", fix)  # noqa: B010 - a method patched for the call
    try:
        yield
    finally:
        for cls, original in originals:
            setattr(cls, "get_num_skipped_tokens", original)  # noqa: B010


def check_fixed_config(config: KVCacheConfig) -> None:
    """K3 fix: refuse a chunked-local chunk that is not a multiple of its block size."""
    for g in config.groups:
        if g.kind == "chunked_local" and g.attention_chunk_size is not None and g.attention_chunk_size % g.block_size:
            raise Unsupported(
                f"vllm-fixed refuses attention_chunk_size={g.attention_chunk_size} with block_size={g.block_size} "
                "(not a multiple: the proposed fix of K3 rejects it at start-up)"
            )


class FixedVllmTarget(VllmTarget):
    """The real vLLM ``KVCacheManager`` with the proposed fixes of K1 and K3."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "vllm-fixed"

    @property
    def version(self) -> str:
        return f"{super().version} with the proposed fixes of {', '.join(FIXED)} (harness/mutants/fixes_vllm.py)"

    def reset(self, config: KVCacheConfig) -> None:
        check_fixed_config(config)
        with fixes_applied():
            super().reset(config)

    def apply(self, op: O.Op) -> Any:
        with fixes_applied():
            return super().apply(op)


def make_target() -> FixedVllmTarget:
    return FixedVllmTarget()
