"""The two glimpses a glimpsed step compares (``harness.core.glimpse``), read for ``Lockstep``.

A manager call's glimpse: the blocks it changed or returned and their keys, in the spec's states
before and after it, widened by what the target's first glimpse shows.  A request operation
(``harness.core.ops.REQUEST_OPS``) makes no manager call, so the only part of the observation it can
change is that request's block hashes: when the target offers ``glimpse_hashes(request_id)``, its
glimpse is those hashes alone (``hashes_glimpse``), read in O(the request's hashes) instead of its
tables' blocks, keys and the ends of the free queue.  Whatever else a faulty target changes during a
request operation is found by the next glimpse that touches it or the next full check (at the
latest at the end of the run; ``kvspec fuzz --target vllm-scheduler``: of the engine step).
"""

from __future__ import annotations

from typing import Any

from kvspec.harness.check.guard import Call, guarded_call, malformed
from kvspec.harness.check.witness import Step, outcome_blocks
from kvspec.harness.core import ops as O
from kvspec.harness.core.glimpse import Glimpse, block_keys, hashes_glimpse, touched_blocks
from kvspec.harness.targets import outcome_schema as S
from kvspec.harness.targets.spec import SpecTarget


def has_glimpse_hashes(target: Any) -> bool:
    """Whether ``target`` offers ``glimpse_hashes(request_id)`` (the request's block hashes as
    ``glimpse`` reads them; None for an unknown request)."""
    return callable(getattr(target, "glimpse_hashes", None))


def glimpses(ref: SpecTarget, target: Any, s: Step, timeout: float | None) -> tuple[Glimpse, Glimpse]:
    """The spec's and the target's glimpses of what step ``s`` touched (module docstring)."""
    rid = str(getattr(s.op, "request_id", ""))
    if isinstance(s.op, O.REQUEST_OPS) and has_glimpse_hashes(target):
        return hashes_glimpse(rid, ref.glimpse_hashes(rid)), _target_hashes(target, s, rid, timeout)
    # A request operation (arrival, appended tokens) makes no manager call: no state before it.
    before_state = ref.state if ref.last_call is None else ref.last_call[0]
    blocks = touched_blocks(before_state, ref.state, rid) | outcome_blocks(s.expected, s.actual)
    keys = block_keys(before_state, blocks) | block_keys(ref.state, blocks)
    tgt = target_glimpse(target, s, rid, blocks, keys, timeout)
    more_blocks = blocks | set(tgt.blocks)
    more_keys = keys | tgt.block_keys() | block_keys(ref.state, more_blocks - blocks)
    # Read again only when the first glimpse lacks a block or key asked for now: one that holds them
    # all is what the second read of the same state returns (build_glimpse reads every block and key
    # asked for, every block of the request's tables and every key of those blocks).
    if not (more_blocks <= tgt.blocks.keys() and more_keys <= tgt.cached.keys()):
        tgt = target_glimpse(target, s, rid, more_blocks, more_keys, timeout)
    return ref.glimpse([rid], more_blocks, more_keys), tgt


def target_glimpse(
    target: Any, s: Step, rid: str, blocks: set[int], keys: set[bytes], timeout: float | None
) -> Glimpse:
    """The target's glimpse (``harness.core.glimpse``), read like ``observe()``."""
    glimpse = getattr(target, "glimpse", None)
    assert callable(glimpse), "glimpse checks need a target with glimpse()"
    out = guarded_call(Call("glimpse()", s.i, s.op), timeout, glimpse, [rid], blocks, keys)
    if not isinstance(out, Glimpse):
        got = S.short_repr(out)
        bad = S.Malformed("glimpse()", "a Glimpse", got)
        raise malformed(Call("glimpse()", s.i, s.op), "a kvspec.harness.core.glimpse.Glimpse", bad, got)
    return out


def _target_hashes(target: Any, s: Step, rid: str, timeout: float | None) -> Glimpse:
    """The target's glimpse of a request operation: ``glimpse_hashes``, read like ``observe()``
    and checked for its form (a tuple of ``bytes``, or None)."""
    call = Call("glimpse_hashes()", s.i, s.op)
    out = guarded_call(call, timeout, target.glimpse_hashes, rid)
    if out is not None and not (isinstance(out, tuple) and all(isinstance(h, bytes) for h in out)):
        got = S.short_repr(out)
        raise malformed(call, "a tuple of bytes, or None", S.Malformed("glimpse_hashes()", "bytes", got), got)
    return hashes_glimpse(rid, out)


__all__ = ["glimpses", "has_glimpse_hashes", "target_glimpse"]
