"""What the world (the model runner and the KV connector) says, as KV-ledger facts.

A lockstep of manager calls learns of a connector load only from the scheduler: the ledger
(``harness.ledger.schedule``) writes an asynchronous load when the scheduler caches its blocks or runs
the request again, and a synchronous one when the scheduler counts its tokens.  A driver that *is* the
world (``harness.vllm_sched.driver``: it reports every load's end and every invalid block to vLLM's
real scheduler) also tells the ledger, as it happens:

- ``finished(rid)``: the connector finished the request's asynchronous load.  Until then a delayed
  load writes nothing: a position counted as computed whose KV never arrived reads an unwritten slot.
- ``invalid(blocks)``: the connector's load into these blocks failed.  Their slots become unwritten
  and no later connector write of the same load fills them (only the model, recomputing, or a fresh
  handout does): a position counted as computed on a failed block is a finding when it is read,
  whatever the scheduler decided.  A failed block the prefix cache already publishes (a synchronous
  load's) is left as it is: vLLM's ``recompute`` policy keeps it cached on purpose, for its request to
  recompute in place, and the ledger's own rules judge what reads it (that a request preempted before
  recomputing leaves it cached for others to hit is a candidate vLLM bug, docs/vllm-scheduler.md).
- ``sampled(rid, tokens)``: the model runner sampled these tokens for the request (accepted drafts,
  then the bonus token); the KV of the next positions is theirs.  The tokens the scheduler appends to
  the request next must be a prefix of them (a stop or ``max_tokens`` drops the rest):
  ``appended_problem`` names any other append, as the ``kv_sampled_is_appended`` ledger rule.

Without a world (``kvspec fuzz`` of a manager alone) nothing changes: loads arrive as the scheduler
says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvspec.spec.kv_ledger import KVLedger, clear_block
from kvspec.spec.types import BlockId


class WorldFacts:
    """The world's load facts for one run's ledger (see the module docstring)."""

    def __init__(self, ledger: KVLedger, is_published: Callable[[int], bool] = lambda b: False) -> None:
        self.ledger = ledger
        self.is_published = is_published  # the block holds a prefix-cache key now
        self.arrived: set[str] = set()  # requests whose current asynchronous load the connector finished
        self.failed: set[int] = set()  # blocks a failed load left unwritten, until handed out again
        self.samples: dict[str, tuple[int, ...]] = {}  # request id -> tokens sampled, not yet appended

    # --- facts from the world ----------------------------------------------------------------------

    def finished(self, rid: str) -> None:
        self.arrived.add(rid)

    def invalid(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if not self.is_published(b):
                clear_block(self.ledger, BlockId(b))
                self.failed.add(b)

    def sampled(self, samples: dict[str, tuple[int, ...]]) -> None:
        """What the model runner sampled in this engine step (what earlier steps sampled is spent)."""
        self.samples = dict(samples)

    def appended_problem(self, rid: str, tokens: tuple[int, ...]) -> str | None:
        """Why the scheduler may not append ``tokens`` to ``rid`` (None: a prefix of what was sampled)."""
        sampled = self.samples.pop(rid, None)
        if sampled is None:
            return f"{rid}: the scheduler appended {list(tokens)}, but the model runner sampled nothing for it"
        if not tokens or tuple(sampled[: len(tokens)]) != tokens:
            return f"{rid}: the scheduler appended {list(tokens)}, but the model runner sampled {list(sampled)}"
        return None

    # --- what the ledger asks ----------------------------------------------------------------------

    def started(self, rid: str) -> None:
        """The request's allocation started a new asynchronous load (nothing of it has arrived)."""
        self.arrived.discard(rid)

    def is_delivered(self, rid: str, block: int, delayed: bool) -> bool:
        """Does a connector write of ``rid`` into ``block`` land: not on a block its load failed, and,
        for an asynchronous load, only once the connector said it finished."""
        return block not in self.failed and (not delayed or rid in self.arrived)

    def renewed(self, blocks: Iterable[int]) -> None:
        """Blocks handed out fresh or released: a new life, no failed load in it."""
        self.failed.difference_update(blocks)
