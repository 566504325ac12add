"""Window coverage: every position a computed token reads lies in a block not yet replaced by the null
block (vLLM 0.33.0), proven where it holds.  ``harness.proofs.coverage_failures`` derives the exact
conditions of the three paths where it does not.

A window group (sliding window or chunked local) replaces the leading blocks no future query reads by
the shared null block: at admission ``add_local_computed_blocks`` pads the table with
``skipped(local + external) // bs`` nulls, and every later ``allocate_slots`` calls
``remove_skipped_blocks(processed)``.  Nulls only ever form a prefix of the table, so a table is
described here by its null prefix ``z`` (in blocks).  The tokens to skip come from the spec itself
(``spec.managers.get_num_skipped_tokens`` on an ``AttentionSpec`` whose sizes are Z3 terms, and
``spec.arith``), called through their modules so a test that mutates a formula sees the proof use it.

What a query reads is written independently of the spec: the query at position ``p`` reads
``[p - W + 1, p]`` (sliding window ``W``), ``[k*C, p]`` with ``k*C <= p < (k+1)*C`` (chunked local,
chunk ``C``), or ``[0, p]`` (full).  It *reads a null* when some position ``q`` it reads lies in the
null prefix: ``first_read(p) <= q <= p`` and ``q < z * bs``.

Hits are described by their shape (proven separately, ``hit_search.per_group`` and the
``sliding_window`` / ``chunked_local`` claims): a hit of ``h = (hz + r) * bs`` tokens is ``hz`` null
placeholders then ``r`` cached blocks; full attention has ``hz = 0``; a sliding-window hit either
starts at block 0 or ends with a run of ``cdiv(W - 1, bs)`` cached blocks; a chunked-local hit has
``hz = align_down(max_length, C) // bs``.  ``h <= max_length <= num_tokens - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvspec.harness.proofs.core import Claim, Outcome, prove_goals
from kvspec.spec import arith, managers
from kvspec.spec.config import AttentionSpec

Num = Any
"""A Python int or a Z3 integer term (the spec's arithmetic runs on both)."""

KINDS = ("full", "sliding_window", "chunked_local")


def group_spec(kind: str, bs: Num, span: Num) -> AttentionSpec:
    """The spec's ``AttentionSpec`` of one group; ``span`` is W or C (ignored for full attention)."""
    if kind == "sliding_window":
        return AttentionSpec("sliding_window", bs, sliding_window=span)
    if kind == "chunked_local":
        return AttentionSpec("chunked_local", bs, attention_chunk_size=span)
    return AttentionSpec("full", bs)


def skipped_blocks(g: AttentionSpec, num_tokens: Num) -> Num:
    """Nulls ``add_local_computed_blocks`` pads a new table with, ``num_tokens`` = local + external."""
    return arith.get_num_skipped_blocks(managers.get_num_skipped_tokens(g, num_tokens), g.block_size)


def removed_blocks(g: AttentionSpec, processed: Num, table_len: Num) -> Num:
    """Leading entries ``remove_skipped_blocks(processed)`` leaves null (it only ever nulls a prefix)."""
    return arith.get_num_blocks_to_remove(managers.get_num_skipped_tokens(g, processed), g.block_size, table_len)


def chunk_index(n: Num, span: Num, name: str) -> tuple[z3.ArithRef, list[Any]]:
    """A fresh chunk index ``k`` of position ``n``: ``k*C <= n < (k+1)*C``."""
    k = z3.Int(name)
    return k, [k * span <= n, n < (k + 1) * span]


def first_read(kind: str, p: Num, span: Num, chunk_of_p: Num = None) -> Num:
    """The lowest position the query at ``p`` reads (independent of ``spec``).  Chunked local reads
    from the start of its chunk: ``chunk_of_p * C`` when symbolic (see ``chunk_index``)."""
    if kind == "full":
        return 0
    concrete = isinstance(p, int) and isinstance(span, int)
    if kind == "sliding_window":
        lo = p - span + 1
        return max(lo, 0) if concrete else z3.If(lo > 0, lo, 0)
    return (p // span) * span if concrete else chunk_of_p * span


def reads_null(first: Num, p: Num, z: Num, bs: Num, q: Num) -> Any:
    """Position ``q`` is read by the query at ``p`` and lies in the null prefix of ``z`` blocks."""
    return z3.And(q >= first, q <= p, q >= 0, q < z * bs)


Goals = list[tuple[str, Any]]


@dataclass(frozen=True)
class Group:
    """One KV-cache group with symbolic sizes and the shape of its hit for the request."""

    kind: str
    bs: z3.ArithRef
    span: z3.ArithRef
    hz: z3.ArithRef  # null placeholders at the front of the hit
    r: z3.ArithRef  # cached blocks after them
    kc: z3.ArithRef  # C // bs (chunked local with C % bs == 0)
    tag: str

    @staticmethod
    def make(kind: str, tag: str = "") -> Group:
        names = " ".join(f"{v}{tag}" for v in ("bs", "span", "hit_nulls", "hit_real", "C_over_bs"))
        bs, span, hz, r, kc = z3.Ints(names)
        return Group(kind, bs, span, hz, r, kc, tag)

    @property
    def spec(self) -> AttentionSpec:
        return group_spec(self.kind, self.bs, self.span)

    @property
    def chunked(self) -> bool:
        return self.kind == "chunked_local"

    def vars(self) -> list[z3.ArithRef]:
        return [self.bs, self.span, self.hz, self.r] + ([self.kc] if self.chunked else [])

    def sizes(self, chunk_multiple: bool = True) -> list[Any]:
        ps = [self.bs >= 1, self.span >= 1]
        if self.chunked and chunk_multiple:
            ps.append(self.span == self.kc * self.bs)
        return ps

    def max_length_chunk(self) -> z3.ArithRef:
        """The chunk index of ``max_length`` that ``hit`` introduces (chunked local)."""
        return z3.Int(f"chunk_of_max_length{self.tag}")

    def hit(self, h: Num, max_length: Num, num_tokens: Num, chunk_multiple: bool = True) -> tuple[list[Any], Goals]:
        """Premises: sizes positive, and the hit of ``h`` tokens has the shape the spec's search returns
        for ``max_length``; lemmas (chunked local, proven first): the hit's nulls end at the chunk of
        ``max_length``.  ``chunk_multiple``: chunked local only with ``C % bs == 0``."""
        ps = self.sizes(chunk_multiple) + [
            self.hz >= 0,
            self.r >= 0,
            h == (self.hz + self.r) * self.bs,
            h <= max_length,
            max_length >= 0,
            max_length <= arith.get_max_cache_hit_length(num_tokens),
        ]
        lemmas: Goals = []
        if self.kind == "full":
            ps.append(self.hz == 0)
        elif self.kind == "sliding_window":
            ps.append(z3.Or(self.hz == 0, self.r >= arith.get_sliding_window_blocks_for_hit(self.span, self.bs)))
        else:
            start = arith.get_chunked_local_hit_start(max_length, self.span)
            km = self.max_length_chunk()
            defs = [km * self.span <= max_length, max_length < (km + 1) * self.span]
            ps += [self.hz == arith.floordiv(start, self.bs), *defs]
            lemmas.append(("lemma: the hit start is the chunk start of max_length", start == km * self.span))
            if chunk_multiple:
                lemmas.append(("lemma: the hit's nulls are its chunk's blocks", self.hz == km * self.kc))
        return ps, lemmas

    def skip_lemmas(self, n: Num, chunk_of_n: Num, chunk_multiple: bool = True) -> Goals:
        """Chunked local: the spec's skip of ``n`` tokens is the start of ``n``'s chunk (and, with
        ``C == kc * bs``, that many blocks).  Proven, then used (chain)."""
        if not self.chunked:
            return []
        tokens = managers.get_num_skipped_tokens(self.spec, n)
        out = [(f"lemma: skip({n}) is its chunk start", tokens == chunk_of_n * self.span)]
        if chunk_multiple:
            out.append((f"lemma: skip({n}) in blocks", skipped_blocks(self.spec, n) == chunk_of_n * self.kc))
        return out

    def admission_nulls(self, num_computed: Num) -> Num:
        """Null prefix after ``add_local_computed_blocks``: ``[null] * s + hits[s:]``, where the kept
        hits may still start with the hit's own placeholders."""
        return arith.maximum(skipped_blocks(self.spec, num_computed), self.hz)

    def query(self, p: Num, name: str) -> tuple[Num, list[Any], Any]:
        """(first position read, premises, chunk index or None) for the query at ``p``."""
        if not self.chunked:
            return first_read(self.kind, p, self.span), [], None
        k, defs = chunk_index(p, self.span, f"chunk_of_{name}{self.tag}")
        return first_read(self.kind, p, self.span, k), defs, k


# --- where coverage holds ------------------------------------------------------------------------


Path = tuple[str, list[Any], Goals, list[Any]]


def admission_path(kind: str) -> Path:
    """A request admitted with a prefix hit ``h`` and ``e`` external tokens (sync, or async and on
    arrival) that leave at least one token to compute, ``h + e <= num_tokens - 1``; its first query
    sits at ``p = h + e``.  Re-admission after preemption is this path: preemption frees the table and
    sets ``num_computed_tokens = 0``."""
    g = Group.make(kind)
    T, h, e, ml, q = z3.Ints("num_tokens hit external max_length q")
    hit_ps, lemmas = g.hit(h, ml, T)
    first, defs, k = g.query(h + e, "p")
    lemmas += g.skip_lemmas(h + e, k)
    premises = [T >= 1, e >= 0, h + e <= T - 1, *hit_ps, *defs]
    goal = z3.Not(reads_null(first, h + e, g.admission_nulls(h + e), g.bs, q))
    return (
        f"admission/{kind}",
        premises,
        [*lemmas, ("the first query reads no null", goal)],
        [T, h, e, ml, q, *g.vars()],
    )


def running_path(kind: str) -> Path:
    """A running request (chunked prefill, decode, spec decode, async scheduling) whose ``k`` committed
    tokens read no null (induction hypothesis); ``allocate_slots`` nulls by the processed count
    ``max(0, num_computed - num_in_flight) = k``; every later query sits at ``p >= k`` (rejected
    drafts are never committed)."""
    g = Group.make(kind)
    k, z, L, p, q = z3.Ints("committed nulls table_len p q")
    first_k, defs_k, ck = g.query(k, "k")
    first_p, defs_p, cp = g.query(p, "p")
    premises = [*g.sizes(), k >= 0, z >= 0, L >= z, z * g.bs <= first_k, p >= k, *defs_k, *defs_p]
    z_after = arith.maximum(z, removed_blocks(g.spec, k, L))
    goals = [*g.skip_lemmas(k, ck)]
    if g.chunked:
        goals.append(("lemma: a later query's chunk is no earlier", cp >= ck))
    goals += [
        ("a later query reads no null", z3.Not(reads_null(first_p, p, z_after, g.bs, q))),
        ("the invariant holds again", z_after * g.bs <= first_k),
    ]
    return f"running/{kind}", premises, goals, [k, z, L, p, q, *g.vars()]


def hybrid_path(kind_a: str, kind_b: str) -> Path:
    """Two groups sharing one pool and one hit length ``h``, a multiple of the alignment ``A`` (the LCM
    of the block sizes; chunked local needs ``bs == A``)."""
    a, b = Group.make(kind_a, "_a"), Group.make(kind_b, "_b")
    T, h, e, ml, A, ka, kb = z3.Ints("num_tokens hit external max_length alignment A_over_bs_a A_over_bs_b")
    premises = [T >= 1, e >= 0, h + e <= T - 1, A == ka * a.bs, A == kb * b.bs, h % A == 0]
    premises += [g.bs == A for g in (a, b) if g.chunked]
    goals: Goals = []
    variables: list[Any] = [T, h, e, ml, A]
    for g in (a, b):
        hit_ps, lemmas = g.hit(h, ml, T)
        first, defs, k = g.query(h + e, "p")
        q = z3.Int(f"q{g.tag}")
        premises += hit_ps + defs
        goals += lemmas + g.skip_lemmas(h + e, k)
        goals.append(
            (
                f"group {g.tag[1:]} ({g.kind}) reads no null",
                z3.Not(reads_null(first, h + e, g.admission_nulls(h + e), g.bs, q)),
            )
        )
        variables += [q, *g.vars()]
    return f"hybrid/{kind_a}+{kind_b}", premises, goals, variables


HYBRIDS = (
    ("full", "sliding_window"),
    ("full", "chunked_local"),
    ("sliding_window", "sliding_window"),
    ("sliding_window", "chunked_local"),
)


def coverage_paths() -> list[Path]:
    return (
        [admission_path(k) for k in KINDS] + [running_path(k) for k in KINDS] + [hybrid_path(a, b) for a, b in HYBRIDS]
    )


def check_paths(paths: Sequence[Path], timeout_s: float) -> Outcome:
    for name, premises, goals, variables in paths:
        outcome = prove_goals(variables, premises, [(f"{name}: {g}", t) for g, t in goals], timeout_s, chain=True)
        if outcome.status != "proven":
            return outcome
    return Outcome("proven", detail=f"{len(paths)} paths")


def check_coverage(timeout_s: float) -> Outcome:
    return check_paths(coverage_paths(), timeout_s)


CLAIMS = [
    Claim(
        "window_coverage.holds",
        "Every position a computed token reads lies in a block not yet replaced by the null block: "
        "admission with a prefix hit and external tokens short of the prompt (sync or async), re-admission "
        "after preemption, chunked prefill, decode, spec decode and async scheduling, under full, "
        "sliding-window and chunked-local groups and their hybrids.",
        (
            "block_size, window, chunk >= 1; hits have the shape the spec's searches return (proven by "
            "hit_search.per_group)",
            "admission: hit + external <= num_tokens - 1 (the scheduler computes from there)",
            "chunked local: attention_chunk_size % block_size == 0 (else see window_coverage.chunk_not_block_multiple)",
            "hybrid: the hit is a multiple of the LCM of the block sizes; chunked local has block_size == that LCM",
        ),
        check_coverage,
        bound="unbounded integers; 3 admission, 3 running (inductive), 4 hybrid paths",
    ),
]
