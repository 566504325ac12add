"""The symbolic KV ledger: what every block slot holds, checked at every read (docs/semantics.md §11).

``spec/`` is exact to vLLM 0.33.0, bugs included, so agreeing with it proves fidelity, not
correctness.  The ledger states what the allocation is for: every KV position a scheduled token
attends to is held by that request in a real block whose slot was written with the right KV before
the read, and nobody else changes it.  It needs no numbers: the KV at a position is named by an
exact identity (``identity``: an interned prefix-trie node), the ledger records which identity each
slot holds (``ledger``), and named predicates (``invariants``, one registry) check every write,
read and publication a step makes.  ``harness.ledger.checker`` feeds it from any target's observed tables.
Nothing here is one engine's: the same ledger holds vLLM and SGLang (docs/sglang.md), and a row
repointed to a cached copy reads right exactly when the copy holds the same identity.

Imports: spec.
"""

from kvspec.spec.kv_ledger.identity import IdentityTrie, KVIdentity, SequenceIdentities, get_position_key
from kvspec.spec.kv_ledger.invariants import (
    LEDGER_INVARIANTS,
    AccessKind,
    LedgerContext,
    LedgerViolation,
    SlotAccess,
    check_ledger,
)
from kvspec.spec.kv_ledger.ledger import (
    KVLedger,
    clear_block,
    get_first_reader,
    get_first_visible,
    get_held,
    get_promised_end,
    get_run_span,
    get_written_blocks,
    iter_slots,
    write_slot,
)

__all__ = [
    "LEDGER_INVARIANTS",
    "AccessKind",
    "IdentityTrie",
    "KVIdentity",
    "KVLedger",
    "LedgerContext",
    "LedgerViolation",
    "SequenceIdentities",
    "SlotAccess",
    "check_ledger",
    "clear_block",
    "get_first_reader",
    "get_first_visible",
    "get_held",
    "get_position_key",
    "get_promised_end",
    "get_run_span",
    "get_written_blocks",
    "iter_slots",
    "write_slot",
]
