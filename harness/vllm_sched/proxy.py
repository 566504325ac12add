"""A proxy around the real scheduler's ``KVCacheManager``: every call becomes kvspec operations.

``install(scheduler, sink)`` replaces ``scheduler.kv_cache_manager`` with a ``ManagerProxy``.  For
every manager call the real vLLM 0.33 ``Scheduler`` makes that can change the manager's state
(``get_computed_blocks``, ``allocate_slots``, ``free``, ``cache_blocks``, ``remove_skipped_blocks``,
``evict_blocks``, ``reset_prefix_cache``), the proxy first brings kvspec's view of the involved
``Request`` up to date with request operations (``AddRequest`` the first time, appended output
tokens, drafts, ``num_computed_tokens``, ``num_in_flight_tokens``, status: ``harness.core.ops``), then
makes the real call, then hands the call as a manager operation with the outcome it produced
(in the JSON form of ``harness/targets/base.py``) to a sink:

- ``LockstepSink`` (``harness.vllm_sched.sink``): a ``harness.check.lockstep.Lockstep`` beside the real
  manager; the first divergence, invariant or ledger problem raises ``FindingError``.
- ``RecordSink`` (``harness.vllm_sched.record``): the operations and outcomes only, for a trace file.

Calls that only read (``get_blocks``, ``get_block_ids``, ``usage``, ...) pass through untouched.
Calls the mirror cannot follow (``pop_blocks_for_free``: deferred frees; copy-on-write copies, which
the scheduler returns to the pool behind the manager's back) raise ``Unsupported``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from kvspec.harness.core import ops as O
from kvspec.harness.core.book import RequestBook
from kvspec.harness.targets.base import Unsupported
from kvspec.harness.targets.vllm import _block_ids

log = logging.getLogger("kvspec.record")
_NOTHING = object()  # no real call made yet (``ManagerProxy._mirrored``)


class Sink(Protocol):
    """Where the proxy sends operations: ``request_op`` before the real call, ``manager_op`` after."""

    def request_op(self, op: O.Op, request: Any) -> None: ...

    def manager_op(self, op: O.Op, outcome: Any, error: BaseException | None) -> None: ...

    @property
    def done(self) -> bool:
        """The sink wants nothing more: the proxy passes every call straight through."""
        ...


def status_name(request: Any) -> str:
    """The request's status in the ops vocabulary: the spec's four statuses by name; vLLM 0.33's
    other statuses (finished ones, streaming) act like RUNNING for the manager (spec/request.py)."""
    name: str = request.status.name
    return name if name in O.REQUEST_STATUSES else "RUNNING"


def _features(request: Any) -> tuple[O.MMFeatureSpec, ...]:
    feats = getattr(request, "mm_features", None) or ()
    return tuple(O.MMFeatureSpec(f.identifier, f.mm_position.offset, f.mm_position.length) for f in feats)


def add_request_op(request: Any) -> O.AddRequest:
    """``AddRequest`` for a real vLLM ``Request`` (its prompt, LoRA, multimodal items, salt)."""
    if getattr(request, "prompt_embeds", None) is not None:
        raise Unsupported("prompt embeddings are not mirrored from the real scheduler")
    lora = request.lora_request
    return O.AddRequest(
        request_id=request.request_id,
        prompt_token_ids=tuple(request.prompt_token_ids or ()),
        lora=None if lora is None else (lora.lora_name, lora.lora_path),
        mm_features=_features(request),
        cache_salt=request.cache_salt,
        **_cache_reads(request),
    )


def _cache_reads(request: Any) -> dict[str, Any]:
    """How a real request may read the prefix cache, in ``AddRequest``'s fields: vLLM up to 0.33
    keeps ``skip_reading_prefix_cache``; 0.34 keeps ``prefix_cache_hit_limit`` instead (0: no read,
    k: up to the prompt-logprob row k, None: unbounded)."""
    if hasattr(request, "skip_reading_prefix_cache"):
        return {"skip_reading_prefix_cache": bool(request.skip_reading_prefix_cache)}
    limit = request.prefix_cache_hit_limit
    if limit == 0:
        return {"skip_reading_prefix_cache": True}
    return {"prompt_logprob_start": limit}


class ManagerProxy:
    """Stands in for ``scheduler.kv_cache_manager``; see the module docstring.

    The proxy passes each call through with exactly the arguments the scheduler gave, so it works
    on any release's signatures; the arguments are read by name against the real method's own
    signature.  ``tolerant`` (the plugin in a user's engine): a call the mirror cannot follow
    (``Unsupported``) turns mirroring off for good, said once on the log, and the engine goes on
    serving; otherwise (kvspec's own drivers) ``Unsupported`` propagates."""

    def __init__(self, real: Any, sink: Sink, tolerant: bool = False) -> None:
        self._real = real
        self._sink = sink
        self.sink = sink
        self.tolerant = tolerant
        self.off: str | None = None  # why mirroring stopped (tolerant mode)
        self._book: RequestBook[None] = RequestBook()
        self._lookups: dict[str, Any] = {}  # request id -> the last lookup result (identity)
        self._requests: dict[str, Any] = {}  # request id -> the real Request
        self._binders: dict[str, _Binder] = {}
        self._result: Any = _NOTHING  # the real call's result, once made (``_mirrored``)
        self.calls = 0  # manager calls mirrored
        self.seconds = 0.0  # time spent in the real calls (bare)

    def __getattr__(self, name: str) -> Any:  # read-only calls and attributes pass through
        return getattr(self._real, name)

    @property
    def passing(self) -> bool:
        """Calls go straight through: the sink wants nothing more, or mirroring was turned off."""
        return self.off is not None or self._sink.done

    def _mirrored(self, name: str, mirror: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The real ``name(*args, **kwargs)``, mirrored by ``mirror`` (which makes the real call
        through ``_call``) unless calls pass through; in tolerant mode ``Unsupported`` turns the
        mirror off and the call still reaches the real manager once."""
        real = getattr(self._real, name)
        if self.passing:
            return real(*args, **kwargs)
        self._result = _NOTHING
        try:
            return mirror(self._arguments(name, args, kwargs), args, kwargs)
        except Unsupported as e:
            if not self.tolerant:
                raise
            self.turn_off(str(e))
            return real(*args, **kwargs) if self._result is _NOTHING else self._result

    def turn_off(self, why: str) -> None:
        """Stop mirroring for good (tolerant mode): said once, serving goes on."""
        if self.off is None:
            self.off = why
            log.warning("kvspec: stopped mirroring this scheduler's manager: %s; serving goes on", why)

    def _arguments(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, defaults filled in, read against the real method's signature
        (a call it does not take is ``Unsupported``)."""
        binder = self._binders.get(name)
        if binder is None:
            binder = self._binders[name] = _Binder(inspect.signature(getattr(self._real, name)))
        a = binder.bind(args, kwargs)
        if a is None:
            raise Unsupported(f"{name} called with arguments its signature does not take: {args!r} {kwargs!r}")
        return a

    # --- request state ---------------------------------------------------------------------------

    def _sync(self, request: Any) -> None:
        """Request operations for what the scheduler changed on ``request`` since the last call."""
        rid = request.request_id
        emit = self._sink.request_op
        if rid not in self._book:
            op: O.Op = add_request_op(request)
            self._book.apply(op)
            self._requests[rid] = request
            emit(op, request)
        elif self._requests[rid] is not request:
            raise Unsupported(f"request id {rid!r} reused by a different Request object")
        r = self._book.get(rid)
        # The order kvspec's scheduler model uses (harness/world/scheduler.py): counts that fall (a step's
        # output processed, drafts rejected, a preemption) before the appended tokens, counts that
        # grow (a step scheduled) after them; drafts cleared before the step's count grows.
        computed, in_flight = request.num_computed_tokens, request.num_in_flight_tokens
        if in_flight < r.num_in_flight_tokens:
            self._emit(O.SetNumInFlightTokens(rid, in_flight), request)
        if computed < r.num_computed_tokens:
            self._emit(O.SetNumComputedTokens(rid, computed), request)
        spec = tuple(request.spec_token_ids)
        if spec and min(spec) < 0:
            raise Unsupported(f"negative draft token ids of {rid!r} (padding) are not mirrored")
        if spec != r.spec_token_ids:
            self._emit(O.SetSpecTokens(rid, spec), request)
        out = request.output_token_ids
        if len(out) != len(r.output_token_ids):
            if len(out) < len(r.output_token_ids) or list(out[: len(r.output_token_ids)]) != r.output_token_ids:
                raise Unsupported(f"output tokens of {rid!r} were rewritten, not appended")
            new = tuple(out[len(r.output_token_ids) :])
            if min(new) < 0:
                raise Unsupported(f"negative output token ids of {rid!r} are not mirrored")
            self._emit(O.AppendOutputTokens(rid, new), request)
        if computed > r.num_computed_tokens:
            self._emit(O.SetNumComputedTokens(rid, computed), request)
        if in_flight > r.num_in_flight_tokens:
            self._emit(O.SetNumInFlightTokens(rid, in_flight), request)
        status = status_name(request)
        if status != r.status:
            self._emit(O.SetStatus(rid, status), request)

    def sync_ids(self, request_ids: Any) -> None:
        """Synchronise the known requests among ``request_ids`` (the end of a scheduler phase)."""
        if self.passing:
            return
        for rid in list(request_ids):
            request = self._requests.get(rid)
            if request is not None:
                self._sync(request)

    def sync_phase_end(self, request_ids: Any) -> None:
        """``sync_ids`` at a scheduler phase's end; in tolerant mode what the mirror cannot follow
        turns it off instead of reaching the scheduler."""
        try:
            self.sync_ids(request_ids)
        except Unsupported as e:
            if not self.tolerant:
                raise
            self.turn_off(str(e))

    def _emit(self, op: O.Op, request: Any) -> None:
        self._book.apply(op)
        self._sink.request_op(op, request)

    # --- the manager calls that change state -----------------------------------------------------

    def _call(self, op: O.Op, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The real call with the scheduler's own arguments, timed; a call that raises goes to the
        sink as the operation with no outcome, then propagates."""
        self.calls += 1
        t = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            self.seconds += time.perf_counter() - t
            self._sink.manager_op(op, None, e)
            raise
        self.seconds += time.perf_counter() - t
        self._result = result
        return result

    def get_computed_blocks(self, *args: Any, **kwargs: Any) -> Any:
        return self._mirrored("get_computed_blocks", self._get_computed_blocks, args, kwargs)

    def _get_computed_blocks(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = a["request"]
        if a.get("max_cache_hit_length") is not None:
            raise Unsupported("get_computed_blocks with max_cache_hit_length is not mirrored")
        self._sync(request)
        op = O.GetComputedBlocks(request.request_id)
        result = self._call(op, self._real.get_computed_blocks, args, kwargs)
        blocks, num_hit = result[0], result[1]
        self._lookups[request.request_id] = blocks
        self._sink.manager_op(op, {"block_ids": _block_ids(blocks), "num_hit_tokens": num_hit}, None)
        return result

    def get_computed_blocks_for_connector(self, *args: Any, **kwargs: Any) -> Any:
        return self._mirrored("get_computed_blocks_for_connector", self._connector_hits, args, kwargs)

    def _connector_hits(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise Unsupported("connectors with divergent local hybrid hits are not mirrored")

    ALLOCATE_FIELDS = (
        "num_new_computed_tokens",
        "num_lookahead_tokens",
        "num_external_computed_tokens",
        "delay_cache_blocks",
        "num_encoder_tokens",
        "full_sequence_must_fit",
        "reserved_blocks",
        "has_scheduled_reqs",
    )
    """``allocate_slots`` keywords that are ``AllocateSlots`` fields of the same name."""
    ALLOCATE_IGNORED = ("self", "request", "num_new_tokens", "new_computed_blocks", "skip_zeroing_group_ids")
    """... and those read otherwise, or not observed (zeroing bookkeeping)."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> Any:
        """The real ``allocate_slots``, mirrored as one ``AllocateSlots`` operation (the computed
        blocks must be the ones this request's lookup returned, or none; a keyword kvspec does not
        model must carry its default)."""
        return self._mirrored("allocate_slots", self._allocate_slots, args, kwargs)

    def _allocate_slots(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = a["request"]
        defaults = self._binders["allocate_slots"].defaults
        for name, value in a.items():
            if name in self.ALLOCATE_FIELDS or name in self.ALLOCATE_IGNORED:
                continue
            if value != defaults.get(name, _NOTHING):
                raise Unsupported(f"allocate_slots({name}={value!r}) is not modelled by kvspec")
        rid = request.request_id
        self._sync(request)
        used = self._lookup_used(rid, a.get("new_computed_blocks"))
        fields = {k: a[k] for k in self.ALLOCATE_FIELDS if k in a}
        op = O.AllocateSlots(rid, a["num_new_tokens"], use_computed_blocks=used, **fields)
        new = self._call(op, self._real.allocate_slots, args, kwargs)
        self._sink.manager_op(op, None if new is None else {"block_ids": _block_ids(new)}, None)
        return new

    def _lookup_used(self, rid: str, new_computed_blocks: Any) -> bool:
        """Are the computed blocks passed the ones this request's lookup returned (then forgotten)?
        Other non-empty blocks are not mirrored (``Unsupported``)."""
        lookup = self._lookups.get(rid)
        used = new_computed_blocks is not None and new_computed_blocks is lookup
        if new_computed_blocks is not None and not used and any(new_computed_blocks.blocks):
            raise Unsupported("allocate_slots with computed blocks other than the lookup's is not mirrored")
        if used:
            del self._lookups[rid]
        return used

    def free(self, *args: Any, **kwargs: Any) -> None:
        self._mirrored("free", self._free, args, kwargs)

    def _free(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        request = a["request"]
        self._sync(request)
        self._lookups.pop(request.request_id, None)
        op = O.Free(request.request_id)
        self._call(op, self._real.free, args, kwargs)
        self._sink.manager_op(op, None, None)

    def cache_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._mirrored("cache_blocks", self._cache_blocks, args, kwargs)

    def _cache_blocks(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        request = a["request"]
        self._sync(request)
        op = O.CacheBlocks(request.request_id, a["num_computed_tokens"])
        self._call(op, self._real.cache_blocks, args, kwargs)
        self._sink.manager_op(op, None, None)

    def remove_skipped_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._mirrored("remove_skipped_blocks", self._remove_skipped_blocks, args, kwargs)

    def _remove_skipped_blocks(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        request_id = a["request_id"]
        # num_prompt_tokens matters to R-SWA groups only (harness.vllm_sched.build builds none).
        if a.get("num_prompt_tokens") is not None and any(
            type(m).__name__ == "RSWAManager" for m in self._real.coordinator.single_type_managers
        ):
            raise Unsupported("remove_skipped_blocks of R-SWA groups is not mirrored")
        if request_id in self._requests:
            self._sync(self._requests[request_id])
        computed: int = a["processed_computed_tokens"] if "processed_computed_tokens" in a else a["num_computed_tokens"]
        op = O.RemoveSkippedBlocks(request_id, computed)
        self._call(op, self._real.remove_skipped_blocks, args, kwargs)
        self._sink.manager_op(op, None, None)

    def evict_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._mirrored("evict_blocks", self._evict_blocks, args, kwargs)

    def _evict_blocks(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        op = O.EvictBlocks(tuple(sorted(a["block_ids"])))
        self._call(op, self._real.evict_blocks, args, kwargs)
        self._sink.manager_op(op, None, None)

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        return bool(self._mirrored("reset_prefix_cache", self._reset_prefix_cache, args, kwargs))

    def _reset_prefix_cache(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        op = O.ResetPrefixCache()
        ok = bool(self._call(op, self._real.reset_prefix_cache, args, kwargs))
        self._sink.manager_op(op, ok, None)
        return ok

    # --- calls the mirror cannot follow ----------------------------------------------------------

    def pop_blocks_for_free(self, *args: Any, **kwargs: Any) -> Any:
        return self._mirrored("pop_blocks_for_free", self._cannot_follow_deferred_frees, args, kwargs)

    def _cannot_follow_deferred_frees(self, a: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise Unsupported("deferred block frees (pop_blocks_for_free) are not mirrored")

    def take_kv_cache_block_copies(self) -> Any:
        copies, retained = self._real.take_kv_cache_block_copies()
        if (copies or retained) and not self.passing:
            why = "copy-on-write block copies are not mirrored"
            if not self.tolerant:
                raise Unsupported(why)
            self.turn_off(why)
        return copies, retained


class _Binder:
    """``inspect.Signature.bind`` for plain positional-or-keyword parameters at a few microseconds a
    call (it sits on every manager call): the arguments by name with the defaults filled in, or None
    when the call does not fit (too many, unknown or missing ones)."""

    def __init__(self, sig: inspect.Signature) -> None:
        params = list(sig.parameters.values())
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params), f"unsupported signature {sig}"
        self.names = [p.name for p in params]
        self.known = frozenset(self.names)
        self.defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        if len(args) > len(self.names) or not self.known.issuperset(kwargs):
            return None
        out = dict(self.defaults)
        out.update(zip(self.names, args, strict=False))
        if any(k in kwargs for k in self.names[: len(args)]):
            return None  # one given twice
        out.update(kwargs)
        return out if len(out) == len(self.names) else None


def install(scheduler: Any, sink: Sink, tolerant: bool = False) -> ManagerProxy:
    """Put a ``ManagerProxy`` feeding ``sink`` in place of ``scheduler.kv_cache_manager`` (``tolerant``:
    see ``ManagerProxy``)."""
    real = scheduler.kv_cache_manager
    if isinstance(real, ManagerProxy):
        raise ValueError("the scheduler's manager is already proxied")
    proxy = ManagerProxy(real, sink, tolerant)
    scheduler.kv_cache_manager = proxy
    cls = type(scheduler)

    # The end of each phase: every request's changes reach the spec then, as kvspec's scheduler
    # model emits them (harness/world/scheduler.py), not only at the request's next manager call.
    def _update_after_schedule(scheduler_output: Any) -> None:
        cls._update_after_schedule(scheduler, scheduler_output)
        proxy.sync_phase_end(scheduler_output.num_scheduled_tokens)

    def update_from_output(scheduler_output: Any, model_runner_output: Any) -> Any:
        out = cls.update_from_output(scheduler, scheduler_output, model_runner_output)
        proxy.sync_phase_end(sorted(scheduler.requests))
        return out

    scheduler._update_after_schedule = _update_after_schedule
    scheduler.update_from_output = update_from_output
    return proxy
