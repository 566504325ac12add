"""The ledger's invariants: named predicates over the slots a step writes, reads or publishes.

One registry per concern, all of one type (``spec.registry``): ``spec.invariants`` holds the
manager's own rules (states and operations), ``LEDGER_INVARIANTS`` what the allocation is for
(docs/semantics.md §11).  A predicate is registered with ``@LEDGER_INVARIANTS.register(rule, kind)``
and reads a ``LedgerContext``: the slot accesses of one kind that one step makes, each resolved
through the request's table and the ledger.  It returns the first access that breaks it (the
witness), or None.  ``check_ledger`` runs every
predicate of the context's kind, in registration order, and returns the first violation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from kvspec.spec.kv_ledger.identity import KVIdentity
from kvspec.spec.registry import Registry
from kvspec.spec.types import NULL_BLOCK_ID

AccessKind = Literal["write", "read", "publish"]


@dataclass(frozen=True, slots=True)
class SlotAccess:
    """One position a step writes, reads or publishes, resolved through the request's table.

    ``block`` is None when the position lies past the table; ``held`` is what the slot holds (before
    a write; None: unwritten); ``shared`` (writes) says another live request may read the block:
    it is referenced twice or published."""

    request_id: str
    group: int
    position: int  # the KV position accessed
    token: int  # the token whose computation accesses it (the position itself for writes)
    block: int | None
    offset: int
    expected: KVIdentity  # the identity the access needs (reads, publishes) or brings (writes)
    held: KVIdentity | None
    shared: bool = False


@dataclass(frozen=True, slots=True)
class LedgerContext:
    """The accesses of one kind that one step (or one publication) makes; ``num_blocks`` is the pool size."""

    kind: AccessKind
    accesses: Sequence[SlotAccess]
    num_blocks: int


@dataclass(frozen=True, slots=True)
class LedgerViolation:
    name: str
    rule: str
    access: SlotAccess

    def __str__(self) -> str:
        a = self.access
        return f"{self.rule} {self.name}: {a.request_id} group {a.group} position {a.position} (block {a.block})"


LEDGER_INVARIANTS: Registry[LedgerContext, SlotAccess] = Registry("ledger invariant", get_args(AccessKind))


def check_ledger(ctx: LedgerContext, names: Sequence[str] | None = None) -> LedgerViolation | None:
    """The first violation among the predicates of ``ctx.kind`` (or the named ones), or None."""
    found = LEDGER_INVARIANTS.check(ctx, names, (ctx.kind,))
    return next((LedgerViolation(inv.name, inv.rule, access) for inv, access in found), None)


def is_real_slot(access: SlotAccess, num_blocks: int) -> bool:
    """The position lies in the table, on a block of the pool other than the null block."""
    return access.block is not None and NULL_BLOCK_ID < access.block < num_blocks


# --- writes ----------------------------------------------------------------------------------------


@LEDGER_INVARIANTS.register("§11.2", "write")
def kv_write_in_real_block(ctx: LedgerContext) -> SlotAccess | None:
    """Every position the model computes lands in a real block of the request's table: not the
    null block (which every request shares), not past the table, not an id outside the pool."""
    return next((a for a in ctx.accesses if not is_real_slot(a, ctx.num_blocks)), None)


@LEDGER_INVARIANTS.register("§11.4", "write")
def kv_write_keeps_shared(ctx: LedgerContext) -> SlotAccess | None:
    """A write into a block another live request may read (``ref_cnt > 1``) or that is published
    (hashed) never changes a written slot's identity; rewriting the same identity (the last
    prompt token after a full remote load or a full prefix hit) is fine."""
    return next((a for a in ctx.accesses if a.shared and a.held is not None and a.held != a.expected), None)


# --- reads ------------------------------------------------------------------------------------------


@LEDGER_INVARIANTS.register("§11.3", "read")
def kv_read_in_real_block(ctx: LedgerContext) -> SlotAccess | None:
    """Every position in a computed token's attention span lies in a real block of its table:
    not the null block (dropped while still in the window), not past the table."""
    return next((a for a in ctx.accesses if not is_real_slot(a, ctx.num_blocks)), None)


@LEDGER_INVARIANTS.register("§11.3", "read")
def kv_read_written(ctx: LedgerContext) -> SlotAccess | None:
    """Every slot a token reads was written since its block was last handed out fresh or released
    without a key."""
    return next((a for a in ctx.accesses if a.held is None), None)


@LEDGER_INVARIANTS.register("§11.3", "read")
def kv_read_own_kv(ctx: LedgerContext) -> SlotAccess | None:
    """Every slot a token reads holds the identity of the reader's own prefix at that position
    (its tokens, LoRA, multimodal items, embeddings), as of the end of the step's writes."""
    return next((a for a in ctx.accesses if a.held != a.expected), None)


# --- publications -------------------------------------------------------------------------------------


@LEDGER_INVARIANTS.register("§11.5", "publish")
def kv_publish_written(ctx: LedgerContext) -> SlotAccess | None:
    """A published (hashed) block holds, by the end of the step that published it, the identities
    its hash stands for in every slot the key covers."""
    return next((a for a in ctx.accesses if a.held != a.expected), None)
