"""Prefix-cache block hashing, byte-identical to vLLM 0.33.0.

A block's identity is the digest of ``(parent hash, block token ids, extra keys)``; the first block's
parent is ``NONE_HASH``.  Modelled on vLLM 0.33.0 ``vllm/utils/hashing.py`` (``sha256``,
``sha256_cbor``) and ``vllm/v1/core/kv_cache_utils.py`` (``init_none_hash``, ``hash_block_tokens``,
``generate_block_hash_extra_keys`` and its ``_gen_*_extra_hash_keys`` helpers,
``get_request_block_hasher``).  Pure standard library: the CBOR encoder below replaces ``cbor2``.

Facts this module reproduces (read from vLLM 0.33.0):

* ``sha256``: SHA-256 of ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``, which is protocol 5
  on every Python vLLM 0.33 supports.
* ``sha256_cbor``: SHA-256 of ``cbor2.dumps(obj, canonical=True)``.  For the value types that occur
  in a block key (None, bool, int, bytes, str, tuples) canonical mode changes nothing; ints beyond
  64 bits become bignums (tag 2 / tag 3).
* ``NONE_HASH = hash_fn(seed)`` where ``seed`` is the ``PYTHONHASHSEED`` string when that variable is
  set (even to ``""``), else ``"vllm-none-hash"`` for the cryptographic algorithms modelled here.
* Pickle quirk: pickle memoises ``str`` objects by identity, so a key tuple in which the *same* string
  object occurs twice (say ``lora_name is lora_path``) pickles, and therefore hashes, differently from
  one holding two equal but distinct strings.  vLLM has the same behaviour; this module keeps it by
  passing the caller's objects through untouched.  ``sha256_cbor`` is identity-blind.

Releases (``spec.releases``; each function takes the ``Profile`` and defaults to 0.33.0):

* ``none_hash_seed`` (0.29.0): up to 0.28 an unset ``PYTHONHASHSEED`` gave 32 random bytes, which
  no model can predict; the spec stands for them with ``RANDOM_NONE_HASH`` and a target of such a
  release must adopt it (the vLLM adapter installs ``get_none_hash(algo, seed, profile)``).
* ``extra_key_form`` (0.31.0): before 0.31 the extra keys were bare values (the LoRA name,
  ``(identifier, offset)``, the salt, the digest): the LoRA path was no part of them.
* ``coarse_block_key`` (0.24.0): before 0.24 a group whose block is ``s`` hash blocks wide was keyed
  on the block's ``s`` fine hashes concatenated (``get_group_block_hashes``), not the last of them.
* ``mm_resume_scan`` (0.31.0): before 0.31 a block hashed after the request's first hashing call
  (``Request.__init__``; later calls come from appended tokens) saw only the request's last
  multimodal item.
"""

from __future__ import annotations

import bisect
import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvspec.spec.config import HashAlgo
from kvspec.spec.releases.profile import BASE, Profile
from kvspec.spec.types import BlockHash

HashFn = Callable[[object], bytes]

PICKLE_PROTOCOL = 5
"""``pickle.HIGHEST_PROTOCOL`` on Python 3.8-3.13; vLLM 0.33 ``sha256`` pickles with it."""

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""vLLM 0.33 ``DEFAULT_NONE_HASH_SEED``: the seed used when ``PYTHONHASHSEED`` is unset."""


# --------------------------------------------------------------------------------------------
# Hash functions (vLLM 0.33 vllm/utils/hashing.py)


def sha256(obj: object) -> bytes:
    """vLLM 0.33 ``vllm.utils.hashing.sha256``: SHA-256 of the protocol-5 pickle of ``obj``."""
    return hashlib.sha256(pickle.dumps(obj, protocol=PICKLE_PROTOCOL)).digest()


def _cbor_head(major: int, value: int) -> bytes:
    """CBOR initial byte(s) for ``major`` type and a non-negative ``value < 2**64``, shortest form."""
    if value < 24:
        return bytes([major << 5 | value])
    if value < 0x100:
        return bytes([major << 5 | 24, value])
    if value < 0x10000:
        return bytes([major << 5 | 25]) + value.to_bytes(2, "big")
    if value < 0x100000000:
        return bytes([major << 5 | 26]) + value.to_bytes(4, "big")
    return bytes([major << 5 | 27]) + value.to_bytes(8, "big")


def _cbor_int(value: int) -> bytes:
    """An int as ``cbor2.dumps`` writes it: major type 0/1, or tag 2/3 + byte string beyond 64 bits."""
    major, magnitude = (0, value) if value >= 0 else (1, -1 - value)
    if magnitude < 1 << 64:
        return _cbor_head(major, magnitude)
    payload = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
    return _cbor_head(6, 2 + major) + _cbor_head(2, len(payload)) + payload


def _cbor_encode(obj: object, out: list[bytes]) -> None:
    if obj is None:
        out.append(b"\xf6")
    elif obj is True:
        out.append(b"\xf5")
    elif obj is False:
        out.append(b"\xf4")
    elif isinstance(obj, int) and not isinstance(obj, bool):
        out.append(_cbor_int(obj))
    elif isinstance(obj, bytes):
        out.append(_cbor_head(2, len(obj)))
        out.append(obj)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out.append(_cbor_head(3, len(data)))
        out.append(data)
    elif isinstance(obj, (tuple, list)):
        out.append(_cbor_head(4, len(obj)))
        for item in obj:
            _cbor_encode(item, out)
    else:
        raise TypeError(f"canonical_cbor: unsupported type {type(obj).__name__} (not a block-key value type)")


def canonical_cbor(obj: object) -> bytes:
    """Byte-identical to ``cbor2.dumps(obj, canonical=True)`` (the call vLLM 0.33 ``sha256_cbor``
    makes) for None, bool, int of any size, bytes, str and nested tuples/lists; TypeError otherwise."""
    out: list[bytes] = []
    _cbor_encode(obj, out)
    return b"".join(out)


def sha256_cbor(obj: object) -> bytes:
    """vLLM 0.33 ``vllm.utils.hashing.sha256_cbor``: SHA-256 of the canonical CBOR of ``obj``."""
    return hashlib.sha256(canonical_cbor(obj)).digest()


_HASH_FNS: dict[str, HashFn] = {"sha256": sha256, "sha256_cbor": sha256_cbor}


def get_hash_fn(algo: HashAlgo) -> HashFn:
    """vLLM 0.33 ``get_hash_fn_by_name`` restricted to the modelled algorithms."""
    try:
        return _HASH_FNS[algo]
    except KeyError:
        raise ValueError(f"unsupported hash algorithm {algo!r}; expected one of {sorted(_HASH_FNS)}") from None


_NONE_HASHES: dict[tuple[str, str], BlockHash] = {}

RANDOM_NONE_HASH = BlockHash(hashlib.sha256(b"kvspec: stands for a NONE_HASH drawn at random").digest())
"""What the spec uses for ``NONE_HASH`` where the release draws it at random (``none_hash_seed ==
"random"``: vLLM 0.23-0.28 ``init_none_hash`` with ``PYTHONHASHSEED`` unset, ``os.urandom(32)``).
Any 32 bytes are as good as the release's own draw; a target of such a release installs these."""


def get_none_hash(algo: HashAlgo, python_hash_seed: str | None = None, profile: Profile = BASE) -> BlockHash:
    """vLLM 0.33 ``init_none_hash`` + ``resolve_none_hash_seed`` for the cryptographic algorithms.

    ``python_hash_seed`` stands for ``os.getenv("PYTHONHASHSEED")``: when it is a string (even
    empty) it is the seed, otherwise the seed is ``"vllm-none-hash"`` (from vLLM 0.29; before,
    ``profile.none_hash_seed == "random"``: ``RANDOM_NONE_HASH``).  ``NONE_HASH`` is the hash of the
    seed *string*.  Results are cached per (algo, seed).
    """
    if python_hash_seed is None and profile.none_hash_seed == "random":
        return RANDOM_NONE_HASH
    seed = DEFAULT_NONE_HASH_SEED if python_hash_seed is None else python_hash_seed
    key = (algo, seed)
    none_hash = _NONE_HASHES.get(key)
    if none_hash is None:
        none_hash = _NONE_HASHES[key] = BlockHash(get_hash_fn(algo)(seed))
    return none_hash


# --------------------------------------------------------------------------------------------
# Per-request inputs that enter the extra keys


@dataclass(frozen=True, slots=True)
class MMFeature:
    """One multimodal item: vLLM 0.33 ``MultiModalFeatureSpec.identifier`` and its
    ``mm_position`` placeholder range ``[offset, offset + length)``."""

    identifier: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class HashFeatures:
    """The request fields vLLM 0.33 ``generate_block_hash_extra_keys`` reads.

    * ``lora``: ``(lora_request.lora_name, lora_request.lora_path)``, or None without LoRA.
    * ``mm_features``: sorted by offset, non-overlapping, each ``length >= 1`` (vLLM assumes this;
      here it is checked).
    * ``cache_salt``: keyed only when truthy (an empty salt adds nothing, as in vLLM).
    * ``prompt_embeds``: the request's ``prompt_embeds`` tensor as one ``bytes`` row per token
      position, ``rows[i] == tensor_data(prompt_embeds[i])``: the row's elements in row-major order,
      each in its dtype's native (little-endian) byte layout, e.g. 4 bytes per float32 or 2 per
      bfloat16 element.  vLLM hashes ``tensor_data(prompt_embeds[start:end])``, the flattened
      uint8 view of the slice, which is exactly the concatenation of those rows; a block past the
      end of the prompt slices fewer (possibly zero) rows, and Python slicing does the same.
    """

    lora: tuple[str, str] | None = None
    mm_features: tuple[MMFeature, ...] = ()
    cache_salt: str | None = None
    prompt_embeds: tuple[bytes, ...] | None = None

    def __post_init__(self) -> None:
        if self.lora is not None and not (len(self.lora) == 2 and all(isinstance(s, str) for s in self.lora)):
            raise ValueError(f"lora must be (lora_name, lora_path) strings, got {self.lora!r}")
        prev_end = 0
        for i, f in enumerate(self.mm_features):
            if f.offset < 0 or f.length < 1:
                raise ValueError(f"mm_features[{i}]: need offset >= 0 and length >= 1, got {f!r}")
            if f.offset < prev_end:
                raise ValueError(
                    f"mm_features[{i}] starts at {f.offset}, before the previous item ends ({prev_end}); "
                    "items must be sorted by offset and non-overlapping"
                )
            prev_end = f.offset + f.length
        if self.prompt_embeds is not None and not all(isinstance(r, bytes) for r in self.prompt_embeds):
            raise ValueError("prompt_embeds must be a tuple of bytes rows, one per token position")


NO_FEATURES = HashFeatures()


def _gen_lora_extra_keys(features: HashFeatures, profile: Profile) -> list[object]:
    """vLLM 0.33 ``_gen_lora_extra_hash_keys``: ``("lora", name, path)`` on every block.  Before
    0.31 (``extra_key_form == "bare"``): the bare name, the path no part of the key."""
    if features.lora is None:
        return []
    name, path = features.lora
    return [("lora", name, path) if profile.extra_key_form == "tagged" else name]


def _gen_mm_extra_keys(features: HashFeatures, start: int, end: int, profile: Profile, resumed: bool) -> list[object]:
    """vLLM 0.33 ``_gen_mm_extra_hash_keys``: ``("mm", identifier, offset - start)`` for every item
    overlapping ``[start, end)``, in offset order; the offset is block-relative and negative for an
    item that began in an earlier block.  vLLM walks a running index across blocks; for sorted,
    non-overlapping items that walk selects exactly the overlapping items, found here by bisection.

    ``resumed``: the block is hashed by a later call than the request's first (``mm_resume_scan``);
    before 0.31 such a call started its walk at the last item, so only that item can be keyed."""
    mm = features.mm_features
    first = bisect.bisect_right(mm, start, key=lambda f: f.offset + f.length)  # first item ending after start
    if resumed and profile.mm_resume_scan == "last_item":
        first = max(first, len(mm) - 1)
    tagged = profile.extra_key_form == "tagged"
    keys: list[object] = []
    for f in mm[first:]:
        if f.offset >= end:
            break
        keys.append(("mm", f.identifier, f.offset - start) if tagged else (f.identifier, f.offset - start))
    return keys


def _gen_cache_salt_extra_keys(features: HashFeatures, start: int, profile: Profile) -> list[object]:
    """vLLM 0.33 ``generate_block_hash_extra_keys``: ``("cache_salt", salt)`` on the block at token 0
    (before 0.31: the bare salt)."""
    if start == 0 and features.cache_salt:
        return [("cache_salt", features.cache_salt) if profile.extra_key_form == "tagged" else features.cache_salt]
    return []


def _gen_prompt_embeds_extra_keys(features: HashFeatures, start: int, end: int, profile: Profile) -> list[object]:
    """vLLM 0.33 ``_gen_prompt_embeds_extra_hash_keys``: ``("prompt_embeds", sha256 digest of the raw
    bytes of embeds[start:end])``; always plain SHA-256, whatever the block hash algorithm (before
    0.31: the bare digest)."""
    if features.prompt_embeds is None:
        return []
    digest = hashlib.sha256(b"".join(features.prompt_embeds[start:end])).digest()
    return [("prompt_embeds", digest) if profile.extra_key_form == "tagged" else digest]


def generate_block_extra_keys(
    features: HashFeatures, start: int, end: int, profile: Profile = BASE, resumed: bool = False
) -> tuple[object, ...] | None:
    """vLLM 0.33 ``generate_block_hash_extra_keys`` for the block covering tokens ``[start, end)``:
    lora + mm + cache_salt + prompt_embeds keys in that order, or None when there are none.
    ``resumed``: the block is hashed after the request's first hashing call (``_gen_mm_extra_keys``)."""
    keys = (
        _gen_lora_extra_keys(features, profile)
        + _gen_mm_extra_keys(features, start, end, profile, resumed)
        + _gen_cache_salt_extra_keys(features, start, profile)
        + _gen_prompt_embeds_extra_keys(features, start, end, profile)
    )
    return tuple(keys) if keys else None


# --------------------------------------------------------------------------------------------
# Chained block hashes


def hash_block_tokens(
    hash_fn: HashFn,
    none_hash: BlockHash,
    parent: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple[object, ...] | None,
) -> BlockHash:
    """vLLM 0.33 ``hash_block_tokens``: ``hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))``.

    As in vLLM, any falsy parent (None or ``b""``) is replaced by ``none_hash``.
    """
    return BlockHash(hash_fn((parent or none_hash, tuple(token_ids), extra_keys)))


def extend_block_hashes(
    block_hashes: tuple[BlockHash, ...],
    all_token_ids: Sequence[int],
    features: HashFeatures,
    hash_block_size: int,
    algo: HashAlgo,
    python_hash_seed: str | None = None,
    profile: Profile = BASE,
) -> tuple[BlockHash, ...]:
    """vLLM 0.33 ``get_request_block_hasher`` (no lookahead tokens) as run by
    ``Request.update_block_hashes``: hash every full ``hash_block_size`` block after the ones in
    ``block_hashes``, chaining from the last of them, and return the whole tuple.

    The result has ``len(all_token_ids) // hash_block_size`` entries.  It equals hashing from
    scratch, except before vLLM 0.31 (``profile.mm_resume_scan``), where blocks after the first
    ones a request hashed may miss multimodal keys (``spec.request.recompute_block_hashes`` follows that).
    ``python_hash_seed`` is ``PYTHONHASHSEED`` as vLLM's ``init_none_hash`` would read it.
    """
    if hash_block_size < 1:
        raise ValueError(f"hash_block_size must be >= 1, got {hash_block_size}")
    num_full = len(all_token_ids) // hash_block_size
    done = len(block_hashes)
    if done > num_full:
        raise ValueError(
            f"{done} block hashes given, but {len(all_token_ids)} tokens fill only {num_full} "
            f"blocks of {hash_block_size}"
        )
    if done == num_full:
        return block_hashes
    hash_fn = get_hash_fn(algo)
    none_hash = get_none_hash(algo, python_hash_seed, profile)
    parent = block_hashes[-1] if block_hashes else None
    resumed = done > 0  # vLLM: the hasher's start token index is past 0
    new: list[BlockHash] = []
    for k in range(done, num_full):
        start, end = k * hash_block_size, (k + 1) * hash_block_size
        extra_keys = generate_block_extra_keys(features, start, end, profile, resumed)
        parent = hash_block_tokens(hash_fn, none_hash, parent, all_token_ids[start:end], extra_keys)
        new.append(parent)
    return block_hashes + tuple(new)


def get_group_block_hashes(
    block_hashes: Sequence[BlockHash], hash_block_size: int, block_size: int, profile: Profile = BASE
) -> Sequence[BlockHash]:
    """A request's hashes as a group of ``block_size`` keys its blocks (vLLM 0.33 ``resolve_block_hashes``
    / ``BlockHashListWithBlockSize``): for a group ``s = block_size // hash_block_size`` hash blocks
    wide, block j's is fine hash ``(j+1)*s - 1``; hashes chain, so that one fingerprints the whole
    prefix.  Before vLLM 0.24 (``profile.coarse_block_key``): the bytes of fine hashes ``j*s`` to
    ``(j+1)*s - 1`` concatenated."""
    if block_size == hash_block_size:
        return block_hashes
    scale = block_size // hash_block_size
    if profile.coarse_block_key == "last_fine_hash":
        return block_hashes[scale - 1 :: scale]
    whole = len(block_hashes) // scale
    return tuple(BlockHash(b"".join(block_hashes[j * scale : (j + 1) * scale])) for j in range(whole))


HASH_BYTES = 32
"""The digest size of every modelled hash function (``sha256``, ``sha256_cbor``)."""


def get_published_hash(key_hash: BlockHash) -> BlockHash:
    """The request hash a KV event names for a block keyed on ``key_hash``.  vLLM publishes the low 64
    bits of the key's hash as an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default), which
    are those of the request hash it ends with: the hash itself, or the last fine hash of a
    concatenated key (before vLLM 0.24, ``get_group_block_hashes``)."""
    return key_hash if len(key_hash) == HASH_BYTES else BlockHash(key_hash[-HASH_BYTES:])
