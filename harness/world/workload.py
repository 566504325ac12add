"""The one workload: what arrives at vLLM's scheduler and what the world answers, for every driver.

``Workload`` holds the scheduler model (``harness.world.scheduler``) and the workload's own state (the
shared prefixes, the prompts sent so far) and offers the actions a serving engine sees: a request
arrives, an engine step runs, a request finishes or is aborted, a remote KV load arrives or fails,
the prefix cache is reset.  Every choice goes through ``Choices``: backed by Hypothesis draws in the
state machine (``harness.check.machine``, so examples shrink), or by a seeded ``random.Random``
(``run_seeded``, for the oracle and impl tests).  Both drive exactly this code.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvspec.harness.core import ops as O
from kvspec.harness.world.choices import Choices
from kvspec.harness.world.records import SchedConfig
from kvspec.harness.world.request_keys import (
    MAX_TURN_SOURCES,
    SALT_LIKE_LORA,
    SHARED_NAME_LORA,
    Turn,
    draw_tail_items,
    next_turn,
)
from kvspec.harness.world.scheduler import Scheduler
from kvspec.spec.config import KVCacheConfig

T = TypeVar("T")

ALPHABET = (1, 2, 3)  # small: identical blocks under different prefixes are common
MAX_LIVE_REQUESTS = 8
MM_ITEM_LENGTHS = {"img-a": 2, "img-b": 5}  # multimodal items: identifier -> placeholder tokens
LORAS = (("sql", "/loras/sql"), ("chat", "/loras/chat"))
CACHE_SALTS = ("tenant-a", "tenant-b")
FEATURES = ("lora", "cache_salt", "mm", "prompt_logprobs")  # features 1..4 of a request (0, 5-7: none)
PROMPT_EMBEDS_FEATURE = 5  # with the prompt_embeds workload feature: an embeddings-only prompt
EMBED_DIM = 2  # float32 elements per prompt_embeds row


def embed_row(token: int) -> str:
    """The prompt_embeds row standing for ``token`` (hex of float32 little-endian): equal tokens
    give equal rows, so embedding prompts share prefixes exactly as token prompts do."""
    return struct.pack(f"<{EMBED_DIM}f", *(token * (i + 1) / 4 for i in range(EMBED_DIM))).hex()


def near_multiple_points(m: int, lo: int, hi: int) -> list[int]:
    """The ints of ``[lo, hi]`` at or next to a multiple of ``m``."""
    return sorted({x for k in range(0, hi // max(m, 1) + 2) for x in (k * m - 1, k * m, k * m + 1) if lo <= x <= hi})


class SeededChoices:
    """``Choices`` from a ``random.Random``: half of the boundary draws land near a multiple."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str, boundary: int | None = None) -> int:
        if hi <= lo:
            return lo
        if boundary and self.rng.random() < 0.5:
            near = near_multiple_points(boundary, lo, hi)
            if near:
                return self.rng.choice(near)
        return self.rng.randint(lo, hi)

    def boolean(self, label: str) -> bool:
        return self.rng.random() < 0.5

    def token(self, label: str) -> int:
        return self.rng.choice(ALPHABET)

    def tokens(self, n: int, label: str) -> tuple[int, ...]:
        return tuple(self.rng.choice(ALPHABET) for _ in range(n))

    def choice(self, options: Sequence[T], label: str) -> T:
        return self.rng.choice(list(options))


def draw_sched_config(ch: Choices, config: KVCacheConfig, *, features: frozenset[str] = frozenset()) -> SchedConfig:
    """The scheduler knobs of one run.  Nothing steers around known target bugs (they are data,
    ``harness.ledger.known_bugs``).  ``features`` are the family's workload features
    (``harness.world.families.workload_features``)."""
    sc = _draw_base_sched_config(ch, config)
    return _engine_mode(sc, config, features)


def _engine_mode(sc: SchedConfig, config: KVCacheConfig, features: frozenset[str]) -> SchedConfig:
    """The family's engine features, applied after the common draws (so every run without them
    draws and emits exactly as before):

    - ``encoder_decoder`` (a config with a cross-attention group): vLLM 0.33 runs encoder-decoder
      models without KV connectors (the scheduler asserts) and, here, without drafts;
    - ``async_scheduling``: vLLM 0.33 ``VllmConfig.max_in_flight_tokens`` is
      ``max_concurrent_batches (2) * max_num_batched_tokens``, so the budget is half of the config's
      ``max_in_flight_tokens``; no connector (a consumer connector defers block frees outside the
      manager API); the drafts drawn in common (``AsyncScheduler`` placeholders, scheduled while
      the previous batch is in flight);
    - ``prompt_embeds``: requests may carry prompt embeddings;
    - ``request_keys``: inputs some release's block keys cannot tell apart (``harness.world.request_keys``)."""
    encoder_decoder = "encoder_decoder" in features
    async_scheduling = "async_scheduling" in features
    if encoder_decoder:
        sc = replace(sc, connector=False, num_spec_tokens=0, num_lookahead_tokens=0)
    elif async_scheduling:
        sc = replace(sc, connector=False)
    if async_scheduling and config.max_in_flight_tokens is not None:
        sc = replace(sc, token_budget=max(1, config.max_in_flight_tokens // 2))
    return replace(
        sc,
        async_scheduling=async_scheduling,
        encoder_decoder=encoder_decoder,
        prompt_embeds="prompt_embeds" in features,
        request_keys="request_keys" in features,
    )


def _draw_base_sched_config(ch: Choices, config: KVCacheConfig) -> SchedConfig:
    """The knobs every family draws, in their historical order."""
    bs = config.scheduler_block_size
    k = ch.choice((0, 0, 1, 2, 3), "num_spec_tokens")
    return SchedConfig(
        token_budget=ch.integer(1, 4 * bs + 1, "token_budget_max", boundary=bs),
        max_num_seqs=ch.integer(1, 6, "max_num_seqs"),
        max_model_len=config.max_model_len,
        block_size=bs,
        num_spec_tokens=k,
        num_lookahead_tokens=ch.choice((0, k), "num_lookahead_tokens") if k else 0,
        connector=ch.boolean("connector"),
        reserve_full_isl=ch.integer(0, 3, "reserve_full_isl?") == 0,
        single_group=len(config.groups) == 1,
        profile=config.profile,
    )


@dataclass(frozen=True)
class Action:
    """One thing that can happen next: its name, when it is possible, how often a seeded run picks it."""

    name: str
    enabled: Callable[[Workload], bool]
    weight: float


class Workload:
    """Arrivals, engine steps and the world's answers, emitted through ``emit`` as ``harness.core.ops``."""

    def __init__(
        self,
        config: KVCacheConfig,
        sched_config: SchedConfig,
        emit: Callable[[O.Op], Any],
        table: Callable[[str], tuple[int, ...]] | None,
        ch: Choices,
    ) -> None:
        self.config = config
        self.emit = emit
        self.sched = Scheduler(sched_config, emit, ch, table)
        self.counts: Counter[str] = Counter()
        self.prefixes: list[tuple[int, ...]] = []
        self.prompts: list[tuple[int, ...]] = []
        self.finished: list[Turn] = []  # request_keys: finished conversations, for a next turn
        self.draw_prefixes(ch)

    def draw_prefixes(self, ch: Choices) -> None:
        """One to three shared prefixes (system prompts) that prompts start with."""
        bs = self.config.scheduler_block_size
        for _ in range(ch.integer(1, 3, "num_prefixes")):
            n = ch.integer(1, max(1, self.config.max_model_len - 2), "prefix_len", boundary=bs)
            self.prefixes.append(ch.tokens(n, "prefix"))

    # --- actions -------------------------------------------------------------------------------

    def run(self, name: str, ch: Choices) -> None:
        """Perform action ``name`` (one of ``ACTIONS``), then drain KV events when they are on."""
        self.sched.ch = ch
        getattr(self, name)(ch)
        if self.config.enable_kv_cache_events:
            self.emit(O.TakeEvents())

    def add_request(self, ch: Choices) -> None:
        """A request arrives: a shared prefix and a suffix (or a repeated prompt), maybe with a
        LoRA adapter, a cache salt, a multimodal item or prompt logprobs."""
        mml = self.config.max_model_len
        bs = self.config.scheduler_block_size
        keys = self.sched.cfg.request_keys
        # request_keys: shorter prompts too, so that output tokens complete the prompt's last block
        limit = max(1, ch.integer(mml // (3 if keys else 2), mml - 1, "prompt_limit"))
        turn: Turn | None = None
        if keys and self.turn_sources() and ch.integer(0, 2, "next_turn?") == 0:
            turn = next_turn(ch, self.turn_sources(), limit)
            prompt = turn[0]
            self.counts["next_turn"] += 1
        elif self.prompts and ch.integer(0, 4, "repeat_prompt?") == 0:
            prompt = ch.choice(self.prompts, "repeated_prompt")
            self.counts["repeat_prompt"] += 1
        else:
            prefix = ch.choice(self.prefixes, "prefix")[:limit]
            n_suffix = ch.integer(0, max(0, limit - len(prefix)), "suffix_len", boundary=bs)
            prompt = prefix + ch.tokens(n_suffix, "suffix")
        prompt = prompt[:limit] or (ALPHABET[0],)
        self.prompts.append(prompt)
        features = ch.integer(0, 7, "features")
        lora = cache_salt = None
        mm: tuple[O.MMFeatureSpec, ...] = ()
        if features == 1:
            lora = ch.choice(LORAS + (SHARED_NAME_LORA,) if keys else LORAS, "lora")
        elif features == 2:
            cache_salt = ch.choice(CACHE_SALTS + (SALT_LIKE_LORA,) if keys else CACHE_SALTS, "cache_salt")
        elif keys and features in (0, 3, 5, 6, 7):
            mm = draw_tail_items(ch, len(prompt), self.config.hash_block_size)
        elif features == 3:
            # An item's identifier is its content hash, so it fixes its placeholder length too.
            ident = ch.choice(sorted(MM_ITEM_LENGTHS), "mm_id")
            length = MM_ITEM_LENGTHS[ident]
            if length <= len(prompt):
                mm = (O.MMFeatureSpec(ident, ch.integer(0, len(prompt) - length, "mm_offset"), length),)
        if turn is not None:
            mm = turn[1]  # a conversation keeps its images
        if 1 <= features <= len(FEATURES):
            self.counts[f"feature_{FEATURES[features - 1]}"] += 1
        embeds = None
        if self.sched.cfg.prompt_embeds and features == PROMPT_EMBEDS_FEATURE:
            # vLLM 0.33: an embeddings-only prompt has no token ids; all_token_ids are zeros.
            embeds, prompt = tuple(embed_row(t) for t in prompt), (0,) * len(prompt)
            self.counts["feature_prompt_embeds"] += 1
        if self.sched.cfg.encoder_decoder:
            mm = (self.encoder_input(ch),)
        start = self.prompt_logprob_start(ch, len(prompt)) if features == 4 else None
        op = O.AddRequest(
            self.sched.new_request_id(),
            prompt,
            lora=lora,
            mm_features=mm,
            cache_salt=cache_salt,
            skip_reading_prefix_cache=features == 4 and start is None,
            prompt_logprob_start=start,
            prompt_embeds=embeds,
        )
        self.sched.add_request(op)

    def prompt_logprob_start(self, ch: Choices, prompt_len: int) -> int | None:
        """A prompt-logprob request: by default it skips the prefix cache (None); a third of them allow
        cache reads and score from a drawn row (vLLM 0.34 bounds their hit there, 0.33 reads it all)."""
        if ch.integer(0, 2, "logprob_reads_cache") != 2:
            return None
        self.counts["feature_prompt_logprob_start"] += 1
        return ch.integer(0, prompt_len, "prompt_logprob_start", boundary=self.config.scheduler_block_size)

    def turn_sources(self) -> list[Turn]:
        """request_keys: the conversations a next turn may continue: live or finished requests that
        have answered (hold output tokens)."""
        reqs = [r for _, r in sorted(self.sched.reqs.items()) if r.output_token_ids]
        return self.finished + [(tuple(r.all_token_ids), r.mm_features) for r in reqs]

    def encoder_input(self, ch: Choices) -> O.MMFeatureSpec:
        """An encoder-decoder request's encoder input (e.g. Whisper's audio): one item at position
        0 whose length is the number of encoder tokens the cross-attention group stores."""
        bs = self.config.scheduler_block_size
        n = ch.integer(1, self.config.max_model_len, "encoder_len", boundary=bs)
        self.counts["encoder_input"] += 1
        return O.MMFeatureSpec(f"audio-{n}", 0, n)

    def step(self, ch: Choices) -> None:
        """One engine step: ``schedule()``, the forward pass, ``update_from_output``."""
        self.sched.step()

    def finish(self, ch: Choices) -> None:
        """A running request stops (EOS, stop token, max tokens)."""
        rid = ch.choice(self.sched.running, "finished")
        r = self.sched.reqs[rid]
        if self.sched.cfg.request_keys and r.output_token_ids:
            self.finished = [*self.finished, (tuple(r.all_token_ids), r.mm_features)][-MAX_TURN_SOURCES:]
        self.sched.finish(rid)

    def abort(self, ch: Choices) -> None:
        """The client goes away (one time in three the rule does nothing)."""
        if ch.integer(0, 2, "abort?") != 0:
            return
        self.sched.abort(ch.choice(sorted(self.sched.reqs), "aborted"))

    def kv_arrives(self, ch: Choices) -> None:
        """A remote KV load finishes; a quarter of them fail, some reporting invalid blocks."""
        sched = self.sched
        rid = ch.choice(sched.loading(), "loaded")
        ok, valid = True, 0
        r = sched.reqs.get(rid)
        if r is not None and ch.integer(0, 3, "load_fails?") == 0:
            ok = False
            bs = sched.cfg.block_size
            # Invalid blocks: truncate at the first invalid block (0.33 _update_requests_with_invalid_blocks).
            # The worker only reports real blocks, so the first invalid one lies past any null prefix.
            table = sched.transfers.table(rid) if sched.transfers.table is not None else ()
            lead = next((i for i, b in enumerate(table) if b), len(table))
            last = -(-r.num_computed_tokens // bs) - 1
            if sched.cfg.single_group and lead <= last and ch.boolean("invalid_blocks?"):
                valid = min(bs * ch.integer(lead, max(lead, last), "first_invalid"), r.num_computed_tokens)
        self.counts["kv_arrives" if ok else "kv_load_failed"] += 1
        sched.kv_arrives(rid, ok, valid)

    def reset_prefix_cache(self, ch: Choices) -> None:
        """An operator resets the prefix cache (one time in four the rule does nothing)."""
        if ch.integer(0, 3, "reset?") != 0:
            return
        ok = self.emit(O.ResetPrefixCache())
        self.counts[f"reset_{'ok' if ok else 'refused'}"] += 1


ACTIONS = (
    Action("add_request", lambda w: len(w.sched.reqs) < MAX_LIVE_REQUESTS, 0.2),
    Action("step", lambda w: not w.sched.idle(), 0.55),
    Action("finish", lambda w: bool(w.sched.running), 0.07),
    Action("abort", lambda w: bool(w.sched.reqs), 0.05),
    Action("kv_arrives", lambda w: bool(w.sched.loading()), 0.1),
    Action("reset_prefix_cache", lambda w: True, 0.03),
)


def run_seeded(
    target: Any,
    config: KVCacheConfig,
    seed: int,
    actions: int,
    *,
    on_op: Callable[[O.Op, Any], None] | None = None,
    features: frozenset[str] = frozenset(),
    sched_limits: Mapping[str, Any] | None = None,
) -> Workload:
    """Reset ``target`` and drive it alone through ``actions`` workload actions chosen by a
    ``random.Random(seed)``; exceptions of the target propagate.  ``on_op(op, outcome)`` sees
    every operation applied; ``sched_limits`` fixes scheduler knobs after the draw (a target's
    ``sched_limits``, ``harness.targets.base``)."""
    rng = random.Random(seed)
    ch = SeededChoices(rng)

    def emit(op: O.Op) -> Any:
        out = target.apply(op)
        if on_op is not None:
            on_op(op, out)
        return out

    target.reset(config)
    sc = draw_sched_config(ch, config, features=features)
    if sched_limits:
        sc = replace(sc, **sched_limits)
    w = Workload(config, sc, emit, lambda rid: target.observe().tables[0].get(rid, ()), ch)
    w.sched.transfers.load_reservation = getattr(target, "load_reservation", None)  # the spec's, when it is the target
    for _ in range(actions):
        enabled = [a for a in ACTIONS if a.enabled(w)]
        w.run(rng.choices(enabled, weights=[a.weight for a in enabled])[0].name, ch)
    return w
