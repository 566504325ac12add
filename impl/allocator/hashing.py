"""Chained block hashing with vLLM 0.33's exact byte format.

The prefix cache keys a full block by a digest of ``(parent hash, block tokens, extra keys)``
(vLLM 0.33 ``kv_cache_utils.hash_block_tokens``).  kvspec's harness compares published hashes
byte for byte, so this module reproduces the serialisation exactly:

- ``sha256``: SHA-256 of ``pickle.dumps(obj, protocol=HIGHEST_PROTOCOL)``;
- ``sha256_cbor``: SHA-256 of canonical CBOR (needs ``cbor2``).

The chain starts from ``NONE_HASH = hash_fn(seed)``, where the seed is ``PYTHONHASHSEED`` when
set and otherwise the fixed string ``"vllm-none-hash"`` (vLLM 0.33 ``init_none_hash`` for
cryptographic hash functions).  Extra keys follow vLLM 0.33 ``generate_block_hash_extra_keys``:
``lora + mm + cache_salt``, tagged tuples, ``None`` when empty.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

HashFn = Callable[[Any], bytes]


def sha256_pickle(obj: Any) -> bytes:
    """vLLM 0.33 ``vllm.utils.hashing.sha256``."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """vLLM 0.33 ``vllm.utils.hashing.sha256_cbor`` (canonical CBOR)."""
    import cbor2

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def get_hash_fn(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown hash algorithm {name!r} (known: {sorted(HASH_FUNCTIONS)})") from None


def none_hash(hash_fn: HashFn) -> bytes:
    """vLLM 0.33 ``init_none_hash`` for a cryptographic ``hash_fn``: the chain's seed digest."""
    seed = os.environ.get("PYTHONHASHSEED")
    return hash_fn(DEFAULT_NONE_HASH_SEED if seed is None else seed)


def hash_block_tokens(
    hash_fn: HashFn, none: bytes, parent: bytes | None, tokens: Sequence[int], extra_keys: tuple[Any, ...] | None
) -> bytes:
    """vLLM 0.33 ``hash_block_tokens``: any falsy parent becomes ``NONE_HASH``."""
    return hash_fn((parent or none, tuple(tokens), extra_keys))


def mm_extra_keys(
    mm: Sequence[tuple[str, int, int]], start: int, end: int, idx: int
) -> tuple[list[tuple[str, str, int]], int]:
    """vLLM 0.33 ``_gen_mm_extra_hash_keys``: ``("mm", identifier, offset - start)`` for each item
    (``(identifier, offset, length)``, sorted by offset) overlapping ``[start, end)``; ``idx`` is the
    running item cursor carried from block to block.  Returns the keys and the next cursor."""
    keys: list[tuple[str, str, int]] = []
    if not mm:
        return keys, idx
    last_ident, last_off, last_len = mm[-1]
    if last_off + last_len <= start:
        return keys, idx
    while idx < len(mm):
        ident, off, length = mm[idx]
        if end <= off:
            break
        if start >= off + length:
            idx += 1
            continue
        keys.append(("mm", ident, off - start))
        if end >= off + length:
            idx += 1
        else:
            break
    return keys, idx


def first_mm_index(mm: Sequence[tuple[str, int, int]], start: int) -> int:
    """vLLM 0.33 ``get_mm_features_in_window`` (low end): first item ending after ``start``."""
    return bisect.bisect_left([off + length for _, off, length in mm], start + 1)


def block_extra_keys(
    lora: tuple[str, str] | None,
    mm: Sequence[tuple[str, int, int]],
    cache_salt: str | None,
    start: int,
    end: int,
    mm_idx: int,
) -> tuple[tuple[Any, ...] | None, int]:
    """vLLM 0.33 ``generate_block_hash_extra_keys``: ``lora + mm + salt`` or ``None``."""
    mm_keys, mm_idx = mm_extra_keys(mm, start, end, mm_idx)
    keys: list[Any] = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    keys.extend(mm_keys)
    if start == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return (tuple(keys) if keys else None), mm_idx


class BlockHasher:
    """Extends a request's hash list over its newly full blocks (vLLM 0.33
    ``get_request_block_hasher`` without lookahead)."""

    __slots__ = ("block_size", "hash_fn", "none")

    def __init__(self, block_size: int, algo: str = "sha256") -> None:
        if block_size < 1:
            raise ValueError(f"hash block size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.hash_fn = get_hash_fn(algo)
        self.none = none_hash(self.hash_fn)

    def extend(
        self,
        hashes: list[bytes],
        tokens: Sequence[int],
        lora: tuple[str, str] | None = None,
        mm: Sequence[tuple[str, int, int]] = (),
        cache_salt: str | None = None,
    ) -> None:
        """Append the hashes of every full block after ``len(hashes)`` (in place)."""
        bs = self.block_size
        start = len(hashes) * bs
        n = len(tokens)
        if start + bs > n:
            return
        plain = lora is None and not mm and not cache_salt
        mm_idx = first_mm_index(mm, start) if (mm and start > 0) else 0
        parent = hashes[-1] if hashes else None
        hash_fn, none = self.hash_fn, self.none
        while start + bs <= n:
            if plain:
                extra = None
            else:
                extra, mm_idx = block_extra_keys(lora, mm, cache_salt, start, start + bs, mm_idx)
            parent = hash_fn((parent or none, tuple(tokens[start : start + bs]), extra))
            hashes.append(parent)
            start += bs
