"""What differs between vLLM releases at the adapter's level, found by probing the installed release.

Behaviour that changed between releases is the spec's business (``spec.releases``); this module only
lets one adapter drive any release from 0.23.0 to 0.34.0.  It reads the installed version, picks
that release's profile, and probes the installed code for what the adapter touches:

- the keyword arguments ``KVCacheManager.__init__`` and ``allocate_slots`` accept (a keyword kvspec
  would pass with a non-default value to a release that lacks it is ``Unsupported``), and the old
  name of one that was renamed (``max_in_flight_tokens`` was ``max_num_batched_tokens`` up to 0.25,
  the same admission cap);
- ``KVCacheBlock``'s hash attributes (``_block_hash`` up to 0.33, the plain ``block_hash`` field in
  0.34; ``_block_hash_num_tokens`` / ``block_hash_num_tokens``, absent where partial keys are);
- ``BlockHashToBlockMap``'s storage: key -> block or ``{block_id: block}`` up to 0.33, key -> block
  id plus a separate ``_dup_ids`` for keys held by several blocks in 0.34;
- ``BlockPool.cached_block_hashes_by_block`` (secondary keys), present from 0.26 on;
- whether ``init_none_hash`` is deterministic: up to 0.28 it draws a random ``NONE_HASH`` when
  ``PYTHONHASHSEED`` is unset, and the adapter then installs the fixed-seed value the spec models
  (``seed_none_hash``).

A release kvspec has no profile for is refused with the nearest known releases named, unless
``KVSPEC_VLLM_PROFILE`` names the known release to assume (then the ``invariants`` relation is the
meaningful one: the spec's exact behaviour is that release's, not the installed one's).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.spec.releases.line import UnknownRelease, profile_for, require_known
from kvspec.spec.releases.profile import Profile

ASSUME_ENV = "KVSPEC_VLLM_PROFILE"
ANY = object()
"""In a ``defaults`` mapping: a keyword that means nothing to a release lacking it (dropped whatever its value)."""


@dataclass(frozen=True)
class VllmApi:
    """The installed release's profile and the shapes of what the adapter touches (module docstring)."""

    version: str
    profile: Profile
    manager_params: frozenset[str] | None  # None: hidden behind ``**kwargs`` (every keyword passed)
    manager_renames: Mapping[str, str]  # kvspec's keyword -> this release's name for it
    allocate_params: frozenset[str] | None
    hash_attr: str  # KVCacheBlock attribute holding the map key
    hash_tokens_attr: str | None  # ... and the number of prefix tokens it covers (None: no such field)
    map_holds_ids: bool  # 0.34: BlockHashToBlockMap stores block ids (+ _dup_ids), not blocks
    logprob_start: bool  # SamplingParams has prompt_logprob_start (0.31 on)
    assumed: tuple[str, ...] = ()  # what the probe could not see and took for granted, in words
    modelled_as: str | None = None  # the known release an unknown installed one is modelled as (ASSUME_ENV)

    def manager_kwargs(self, wanted: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
        """``wanted`` restricted to what ``KVCacheManager.__init__`` accepts; a keyword it lacks may
        only carry its default (``defaults``), else this release cannot model the config.  A keyword
        the release spells otherwise (``manager_renames``) goes under its old name, unless it is at
        its default (then the release's own default, the same, applies)."""
        renames = self.manager_renames
        renamed = {renames.get(k, k): v for k, v in wanted.items() if k not in renames or v != defaults.get(k, ANY)}
        return _accepted("KVCacheManager.__init__", self.manager_params, renamed, defaults, self.version)

    def allocate_kwargs(self, wanted: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
        """The same for ``allocate_slots``."""
        return _accepted("allocate_slots", self.allocate_params, wanted, defaults, self.version)


class ReleaseMismatch(Exception):
    """The installed release cannot take a keyword kvspec needs for this config or call."""


def _accepted(
    what: str, params: frozenset[str] | None, wanted: Mapping[str, Any], defaults: Mapping[str, Any], version: str
) -> dict[str, Any]:
    out = {}
    for name, value in wanted.items():
        if params is None or name in params:  # None: it takes any keyword (a wrapper's **kwargs)
            out[name] = value
        elif name in defaults and (defaults[name] is ANY or value == defaults[name]):
            continue
        else:
            raise ReleaseMismatch(f"vLLM {version} {what} has no {name!r} (asked for {value!r})")
    return out


def installed_profile(version: str, assumed: str | None = None) -> Profile:
    """The profile of ``version``, or of the release ``assumed`` names (``KVSPEC_VLLM_PROFILE``, read
    at the edges into the run's options) for an unknown one; ``UnknownRelease`` otherwise, saying how
    to check such a release anyway."""
    assumed = (assumed or "").strip()
    if assumed:
        installed = _known(version)
        if installed is not None and installed != require_known(assumed):
            raise UnknownRelease(
                f"{ASSUME_ENV}={assumed} asks to model vLLM {version} as {assumed}, but kvspec knows {version} "
                f"itself: every difference between the two would be a false finding.  Unset {ASSUME_ENV} (it is "
                "for a release kvspec does not know)"
            )
        return profile_for(require_known(assumed))
    try:
        return profile_for(require_known(version))
    except UnknownRelease as e:
        raise UnknownRelease(
            f"{e}.  To check it anyway against the invariants and the KV ledger, assume the nearest known "
            f"release: {ASSUME_ENV}=<release> kvspec fuzz --target vllm --relation invariants"
        ) from None


def _known(version: str) -> str | None:
    """``version`` as a release kvspec knows, else None."""
    try:
        return require_known(version)
    except UnknownRelease:
        return None


def probe(
    version: str, manager_cls: Any, block_cls: Any, map_cls: Any, sampling_cls: Any, assumed: str | None = None
) -> VllmApi:
    """The ``VllmApi`` of the installed release (module docstring)."""
    slots = fields_of(block_cls)
    hash_attr = "_block_hash" if "_block_hash" in slots else "block_hash"
    tokens = next((a for a in ("_block_hash_num_tokens", "block_hash_num_tokens") if a in slots), None)
    map_init = inspect.signature(map_cls.__init__).parameters
    manager_params = _params(manager_cls.__init__)
    allocate_params = _params(manager_cls.allocate_slots)
    probed = (("KVCacheManager.__init__", manager_params), ("allocate_slots", allocate_params))
    hidden = [what for what, params in probed if params is None]
    return VllmApi(
        version=version,
        profile=installed_profile(version, assumed),
        modelled_as=(assumed or "").strip() or None,
        manager_params=manager_params,
        manager_renames={
            new: old
            for new, old in _RENAMED_MANAGER_PARAMS.items()
            if manager_params is not None and new not in manager_params and old in manager_params
        },
        allocate_params=allocate_params,
        hash_attr=hash_attr,
        hash_tokens_attr=tokens,
        map_holds_ids="blocks" in map_init,
        logprob_start="prompt_logprob_start" in fields_of(sampling_cls),
        assumed=tuple(
            f"vLLM {version} {w} shows only *args/**kwargs (a wrapper without functools.wraps?): "
            "every keyword is passed to it, and one it does not take will raise (a target-raised finding)"
            for w in hidden
        ),
    )


def fields_of(cls: Any) -> set[str]:
    """The fields of a vLLM class, whichever form it takes in a release: a msgspec struct
    (``SamplingParams``), a dataclass (``ModelRunnerOutput``), or a class with ``__slots__``
    (``KVCacheBlock``)."""
    return (
        set(getattr(cls, "__slots__", ()))
        | set(getattr(cls, "__struct_fields__", ()))
        | set(getattr(cls, "__dataclass_fields__", {}))
    )


_RENAMED_MANAGER_PARAMS = {"max_in_flight_tokens": "max_num_batched_tokens"}
"""``KVCacheManager.__init__`` keywords that releases spelled otherwise, with the same meaning: the
token count the sliding-window and chunked-local admission caps add (vLLM 0.26 renamed it; the
arithmetic is unchanged, and ``None`` means ``max_model_len`` in both)."""


def _params(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keywords ``fn`` takes, seen through wrappers: ``__wrapped__`` (``functools.wraps``), else a
    function of the same name the wrapper closes over; None when all it shows is ``*args, **kwargs``."""
    params = inspect.signature(inspect.unwrap(fn)).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return frozenset(p for p in params if p != "self")
    for inner in _closed_over(fn):
        found = _params(inner)
        if found is not None:
            return found
    named = frozenset(p for p, v in params.items() if p != "self" and v.kind not in _VARIADIC)
    return named or None


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _closed_over(fn: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The functions named like ``fn`` in its closure (the original a hand-written wrapper calls)."""
    cells = getattr(inspect.unwrap(fn), "__closure__", None) or ()
    out: list[Callable[..., Any]] = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(value) and value is not fn and value.__name__ == getattr(fn, "__name__", None):
            out.append(value)
    return out


def split_computed(result: tuple[Any, ...]) -> tuple[Any, int]:
    """``get_computed_blocks``'s blocks and hit length: it returns ``(blocks, hits)`` up to 0.25 and
    ``(blocks, hits, shared_prefix_boundary)`` from 0.26 on."""
    return result[0], int(result[1])


def seed_none_hash(kv_cache_utils: Any, hash_fn: Callable[[Any], bytes], spec_none_hash: bytes) -> bytes:
    """Run the release's ``init_none_hash(hash_fn)`` and return the ``NONE_HASH`` it leaves.

    Two calls that disagree mean the release draws ``NONE_HASH`` at random (``os.urandom``: up to
    0.28 when ``PYTHONHASHSEED`` is unset); no model can predict that, so ``spec_none_hash``, the
    value the spec hashes from for this config, is installed instead.  A deterministic release keeps
    its own value, so a wrong seed there still shows as a divergence."""
    kv_cache_utils.init_none_hash(hash_fn)
    first = kv_cache_utils.NONE_HASH
    kv_cache_utils.init_none_hash(hash_fn)
    if kv_cache_utils.NONE_HASH != first:
        kv_cache_utils.NONE_HASH = spec_none_hash
    return bytes(kv_cache_utils.NONE_HASH)
