"""Reports: on a finding, write ``trace.json``, a replayable pytest file and ``report.md``.

The folder is written atomically: everything goes into a temporary folder next to the
destination, which is then renamed into place, so a reader never sees half a report.
``report.md`` says what broke in one sentence, lists the steps (reduced or as the run recorded
them: it says which), and draws, for the request of the failing step, its token layout in the style
of vLLM's ``allocate_slots`` comment (``| comp | new_comp | ext_comp | new | lookahead |``) and its
block tables before and after.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kvspec.harness.core import ops as O
from kvspec.harness.core.observation import Observation
from kvspec.harness.core.ops_json import op_to_json
from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.traces.trace import Trace, dumps_trace

REPLAY_TEST = '''"""Replays {name}: fails while the finding it records is still there."""

from pathlib import Path

import pytest

from kvspec.harness.run.catalogue import replay_recorded
from kvspec.harness.targets import TargetLoadError
from kvspec.harness.traces.trace import read_trace

TRACE = Path(__file__).with_name("trace.json")


def test_replay_{ident}() -> None:
    try:
        result = replay_recorded(read_trace(TRACE), str(TRACE), {target!r}, strict_known={strict})
    except TargetLoadError as e:  # a replay that cannot run is no pass: deselect it where the target is absent
        pytest.fail(f"target {target!r} cannot be loaded here, so the trace was not replayed: {{e}}")
    assert result.ok, result.message
'''
"""The replay test of a report: the trace replayed by its target's driver (harness.run.catalogue: the
manager lockstep replays its operations; vLLM's real scheduler re-drives its recorded run)."""


def write_report(out_dir: str | Path, trace: Trace, name: str | None = None, replace: bool = False) -> Path:
    """Write the report folder for ``trace`` under ``out_dir``; return its path.  The folder gets the
    usual permissions (0777, files 0666, minus the umask: a CI uploader running as another user can
    read it), not ``mkdtemp``'s 0700.  An existing folder of that name is kept and the new one named
    ``NAME-2`` and so on, unless ``replace``: then the new folder, written whole beside it, takes its
    place (a known bug's report is the latest run's meeting, not an earlier run's)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = name or _default_name(trace)
    dest = out / name
    n = 1
    while dest.exists() and not replace:
        n += 1
        dest = out / f"{name}-{n}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out))
    try:
        (tmp / "trace.json").write_text(dumps_trace(trace), encoding="utf-8")
        ident = "".join(c if c.isalnum() else "_" for c in dest.name)
        (tmp / f"test_replay_{ident}.py").write_text(
            REPLAY_TEST.format(name=dest.name, ident=ident, target=trace.target_name, strict=is_known_bug(trace)),
            encoding="utf-8",
        )
        (tmp / "report.md").write_text(render_report(trace), encoding="utf-8")
        mask = os.umask(0o022)  # reading the umask means setting it: put back at once
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # the files were created 0666 & ~umask already
        old = _move_aside(dest, out) if replace and dest.exists() else None
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def _move_aside(folder: Path, out: Path) -> Path:
    """Rename ``folder`` to a hidden name under ``out`` (to be removed once its successor is in place)."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=out))
    aside.rmdir()
    folder.rename(aside)
    return aside


def _default_name(trace: Trace) -> str:
    """``kvspec-<target>-<family>-<kind>-seed<seed>``, as a plain folder name (no ``/``, ``.`` or ``:``)."""
    kind = (trace.finding or {}).get("kind", "trace")
    seed = trace.seed if trace.seed is not None else "none"
    name = f"kvspec-{trace.target_name}-{trace.family or 'custom'}-{kind}-seed{seed}"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:200]


# --- rendering -----------------------------------------------------------------------------------


def _steps_note(trace: Trace) -> str:
    """How many steps, and whether kvspec's reducer made them fewer than the run recorded."""
    recorded = trace.extra.get("recorded_steps")
    if isinstance(recorded, int) and recorded > len(trace.steps):
        return f"{len(trace.steps)}, reduced from the {recorded} the run recorded"
    return f"{len(trace.steps)}, as the run recorded them"


def render_report(trace: Trace) -> str:
    f = trace.finding or {}
    step = f.get("step")
    lines = [f"# kvspec report: {f.get('kind', 'trace')} on target `{trace.target_name}`", ""]
    headline, detail = _headline(trace)
    lines.append(f"**{headline}**")
    plain = trace.extra.get("what_went_wrong")
    if isinstance(plain, str) and plain:
        lines += ["", plain]  # the run's own words (a known bug's report: harness.ledger.known_bugs)
    lines.append("")
    if detail:
        lines.append(f"- the check's words: {detail}")
    lines += [
        f"- target: `{trace.target_name}` {trace.target_version}".rstrip(),
        f"- family: `{trace.family}`, seed: `{trace.seed}`, profile: `{trace.profile}`, relation: `{trace.relation}`",
        f"- config: {_config_line(trace)}",
        f"- replay: {_replay_line(trace)}",
        "",
        f"## Steps ({_steps_note(trace)})",
        "",
        "```",
    ]
    for i, (op, outcome) in enumerate(trace.steps):
        mark = ">>" if i == step else "  "
        lines.append(f"{mark} {i:3d} {_op_line(op)}  ->  {_outcome_line(outcome)}")
    lines.append("```")
    if step is not None and 0 <= step < len(trace.steps):
        lines += _failing_step_section(trace, step, f)
    if trace.extra.get("driver") == "vllm-engine":
        lines += _engine_section(trace, f)
    if f.get("kv_markdown"):
        lines += ["", f["kv_markdown"].rstrip()]
    if f.get("traceback"):
        lines += ["", "## Traceback", "", "```", f["traceback"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _engine_section(trace: Trace, f: dict[str, Any]) -> list[str]:
    """A real engine's finding (``harness.engine``): where, the workload, the engine's last manager calls."""
    x = trace.extra
    cache = {True: "on", False: "off", None: "on and off compared"}.get(x.get("prefix_caching"), "?")
    lines = [
        "",
        "## In the engine",
        "",
        f"- model: `{x.get('model_kind')}`, prefix cache {cache}, check: {x.get('check')}",
    ]
    for r in (x.get("workload") or {}).get("requests", []):
        more = "".join(
            f", {k} {r[k]}"
            for k in ("arrive_step", "abort_step", "n")
            if r.get(k) not in (None, 0, 1) or k == "arrive_step"
        )
        lines.append(f"- request: prompt of {len(r.get('prompt', ()))} tokens, {r.get('max_tokens')} to generate{more}")
    w = f.get("witness") or {}
    last = next((v for k, v in w.items() if k.startswith("last_") and isinstance(v, list)), None)
    if last:
        lines += ["", f"### The engine's last {len(last)} manager calls (of {w.get('manager_calls', '?')})", "", "```"]
        lines += [json.dumps(c, separators=(",", ":"))[:300] for c in last] + ["```"]
    return lines


def is_known_bug(trace: Trace) -> bool:
    """Does the trace record a known target bug (``harness.ledger.known_bugs``: its finding's message
    names it)?  A plain replay counts such a bug as known and passes; ``--strict-known`` fails on it."""
    return str((trace.finding or {}).get("message", "")).startswith("known bug K")


def _replay_line(trace: Trace) -> str:
    """How to replay the report, and what the replay says while the finding is there."""
    if is_known_bug(trace):
        return (
            f"`{_replay_command(trace)} --strict-known` (exit 1 while the bug is there; without "
            "`--strict-known` a replay counts it as the known bug it is and exits 0; this folder's pytest "
            "file replays it strictly)"
        )
    return f"`{_replay_command(trace)}` (exit 1 while the finding is there)"


def _replay_command(trace: Trace) -> str:
    return replay_command("<this folder>", trace.target_name)


def replay_command(folder: str | Path, target_name: str) -> str:
    """``kvspec replay`` of a report folder; a target that is not built in is named with ``--target``
    (replay never takes such a target from the trace file itself)."""
    from kvspec.harness.core.target_names import is_user_target

    if not is_user_target(target_name):
        return f"kvspec replay {folder}"
    return f"kvspec replay {folder} --target {target_name}"


SHORT = 100  # a check's message at most this long goes in the headline itself


def _headline(trace: Trace) -> tuple[str, str | None]:
    """The report's bold first line: what kind of finding, where, which known bug; and the check's
    own message when it is too long (or too technical: a known bug's, after its plain-words
    paragraph) to sit in a headline."""
    f = trace.finding
    if not f:
        return f"A recorded trace of {len(trace.steps)} steps with no finding.", None
    what, message = _what_and_where(trace, f), str(f.get("message", ""))
    known = re.match(r"(known bug K\d+ \([^)]*\)): ?(.*)", message, re.S)
    if known:
        return f"{what}: {known[1]}.", known[2] or None
    if len(message) <= SHORT:
        return f"{what}: {message}", None
    return f"{what}.", message


def _what_and_where(trace: Trace, f: dict[str, Any]) -> str:
    """``The KV ledger found a wrong read or write at step 5 (`set_num_computed_tokens`)``."""
    where = f"step {f['step']}" if f.get("step") is not None else "setup"
    op = f" (`{f['op']['op']}`)" if f.get("op") else ""
    what = {
        "invariant": "An invariant broke",
        "divergence": "The target diverged from the spec",
        "target-raised": "The target raised",
        "target-hung": "The target hung",
        "reference-raised": "The spec rejected an operation",
        "reference-invariant": "A spec invariant broke",
        "target-malformed": "The target returned something the protocol does not allow",
        "target-memory": "The target ran out of its memory bound",
        "kv-ledger": "The KV ledger found a wrong read or write",
        "kv-mismatch": "The KV oracle computed wrong numbers",
        "engine-table": "The model runner was given a block table that is not the manager's",
        "engine-output": "The engine's output is not the reference model's",
        "engine-logprobs": "The engine's prompt logprobs are not the reference model's",
    }.get(f.get("kind", ""), "A finding")
    if trace.extra.get("driver") == "vllm-engine" and f.get("step") is None:
        if f.get("kind") == "kv-mismatch":
            what = "The engine's paged KV cache holds numbers the reference model does not"
        where = f"the {trace.extra.get('model_kind')} model"
    return f"{what} at {where}{op}"


def _config_line(trace: Trace) -> str:
    c = trace.config
    groups = ", ".join(
        f"{g.kind}(bs={g.block_size}"
        + (f", W={g.sliding_window}" if g.sliding_window else "")
        + (f", C={g.attention_chunk_size}" if g.attention_chunk_size else "")
        + ")"
        for g in c.groups
    )
    return (
        f"{c.num_blocks} blocks, [{groups}], max_model_len={c.max_model_len}, "
        f"caching={'on' if c.enable_caching else 'off'}, events={'on' if c.enable_kv_cache_events else 'off'}"
    )


def _op_line(op: O.Op) -> str:
    d = op_to_json(op)
    name = d.pop("op")
    parts: list[str] = []
    for k, v in d.items():
        if k in ("request_id",):
            parts.insert(0, str(v))
            continue
        if v in (0, False, None, [], ()) and k not in ("num_new_tokens", "num_computed_tokens"):
            continue
        parts.append(f"{k}={v}")
    return f"{name}({', '.join(parts)})"


def _outcome_line(outcome: Any) -> str:
    """One outcome in a few words (a finding's ``expected`` / ``actual`` may be any JSON a target returned)."""
    if outcome is None:
        return "None"
    if isinstance(outcome, dict):
        if "num_hit_tokens" in outcome:
            return f"hit {outcome['num_hit_tokens']} tokens, blocks {outcome.get('block_ids')}"
        return f"new blocks {outcome.get('block_ids')}"
    if isinstance(outcome, list):
        return f"{len(outcome)} event(s)"
    return repr(outcome)


def _replay_spec(trace: Trace, upto: int) -> tuple[SpecTarget, Observation | None, Observation | None, Any]:
    """Run the spec to just before step ``upto``; then try the step.  Returns the target (after),
    the observation before and after, and the request as it was before the step."""
    t = SpecTarget()
    t.reset(trace.config)
    for op, _ in trace.steps[:upto]:
        try:
            t.apply(op)
        except Exception:
            return t, None, None, None
    before = t.observe()
    op = trace.steps[upto][0]
    req = t.requests.get(getattr(op, "request_id", ""), None)
    try:
        t.apply(op)
        after = t.observe()
    except Exception:
        after = None
    return t, before, after, req


def _failing_step_section(trace: Trace, step: int, f: dict[str, Any]) -> list[str]:
    op = trace.steps[step][0]
    lines = ["", f"## The failing step: {step} `{_op_line(op)}`", ""]
    if f.get("expected") is not None or f.get("actual") is not None or f.get("kind") == "divergence":
        lines += [
            f"- expected (spec): {_outcome_line(f.get('expected'))}",
            f"- observed (target): {_outcome_line(f.get('actual'))}",
        ]
    if f.get("blocks") or f.get("requests"):
        lines.append(f"- witness: blocks {f.get('blocks')}, requests {f.get('requests')}")
    _, before, after, req = _replay_spec(trace, step)
    rid = getattr(op, "request_id", None)
    if req is not None:
        lines += [
            "",
            f"### Token layout of `{rid}` (num_tokens={req.num_tokens}, prompt={req.num_prompt_tokens}, "
            f"drafts={len(req.spec_token_ids)})",
            "",
            "```",
        ]
        lines += draw_token_layout(op, req.num_computed_tokens, req.num_tokens)
        lines.append("```")
    requests = sorted(set(f.get("requests") or ()) | ({rid} if rid else set()))
    if not requests:
        return lines
    tables: dict[tuple[str, ...], list[str]] = {}  # a drawing -> the states drawn so, in order
    for label, obs in (("before (spec)", before), ("after (spec)", after)):
        if obs is not None:
            tables.setdefault(tuple(draw_tables(obs, trace, requests)), []).append(label)
    w = f.get("witness") or {}
    for key, label in (("target_before", "before (target)"), ("target_after", "after (target)")):
        if key in w:
            tables.setdefault(tuple(draw_tables_json(w[key], trace, requests)), []).append(label)
    for drawing, labels in tables.items():  # equal tables once, under every label they stand for
        same = " (the same)" if len(labels) > 1 else ""
        lines += ["", f"### Block tables {', '.join(labels)}{same}", "", "```", *drawing, "```"]
    return lines


def draw_token_layout(op: O.Op, comp: int, num_tokens: int) -> list[str]:
    """``| comp | new_comp | ext_comp | new | lookahead |`` with each part's size and token range."""
    if isinstance(op, O.AllocateSlots):
        parts = [
            ("comp", comp),
            ("new_comp", op.num_new_computed_tokens),
            ("ext_comp", op.num_external_computed_tokens),
            ("new", op.num_new_tokens),
            ("lookahead", op.num_lookahead_tokens),
        ]
    else:
        parts = [("comp", comp), ("not computed", max(0, num_tokens - comp))]
    cells, ranges, start = [], [], 0
    for name, n in parts:
        label = f" {name}={n} "
        rng = f" [{start},{start + n}) "
        w = max(len(label), len(rng))
        cells.append(label.center(w))
        ranges.append(rng.center(w))
        start += n
    bar = "|" + "|".join(cells) + "|"
    out = ["-" * len(bar), bar, " " + " ".join(ranges), "-" * len(bar)]
    if isinstance(op, O.AllocateSlots):
        out.append(
            f"to be allocated: [{comp + op.num_new_computed_tokens}, {start}); to be cached (unless delayed): "
            f"up to min({comp + op.num_new_computed_tokens + op.num_external_computed_tokens + op.num_new_tokens}, "
            f"num_tokens={num_tokens})"
        )
    return out


def draw_tables(obs: Observation, trace: Trace, requests: list[str]) -> list[str]:
    out = []
    for g, tables in enumerate(obs.tables):
        spec = trace.config.groups[g]
        out.append(f"group {g} ({spec.kind}, block_size {spec.block_size})")
        for rid in requests:
            table = tables.get(rid)
            if table is None:
                out.append(f"  {rid}: no table")
                continue
            ncb = obs.num_cached_block[g].get(rid)
            ids, refs, hashed = [], [], []
            for b in table:
                if b == 0:
                    ids.append("null")
                    refs.append("-")
                    hashed.append("-")
                else:
                    ids.append(str(b))
                    refs.append(str(obs.ref_cnt[b]))
                    hashed.append("#" if obs.block_key[b] is not None else ".")
            out += _table_rows(rid, ids, refs, hashed, ncb)
    out.append(f"free queue (front first): {list(obs.free_queue)}")
    return out


def draw_tables_json(w: dict[str, Any], trace: Trace, requests: list[str]) -> list[str]:
    out = []
    for g, tables in enumerate(w.get("tables", [])):
        spec = trace.config.groups[g] if g < len(trace.config.groups) else None
        out.append(f"group {g}" + (f" ({spec.kind}, block_size {spec.block_size})" if spec else ""))
        for rid in requests:
            if rid not in tables:
                out.append(f"  {rid}: no table")
                continue
            ids, refs, hashed = [], [], []
            for b in tables[rid]:
                info = w.get("blocks", {}).get(str(b), {})
                ids.append("null" if b == 0 else str(b))
                refs.append("-" if b == 0 else str(info.get("ref_cnt", "?")))
                hashed.append("-" if b == 0 else ("#" if info.get("hash") else "."))
            ncbs = w.get("num_cached_block", [])
            ncb = ncbs[g].get(rid) if g < len(ncbs) else None
            out += _table_rows(rid, ids, refs, hashed, ncb)
    out.append(f"free queue (front first): {w.get('free_queue')}")
    return out


def _table_rows(rid: str, ids: list[str], refs: list[str], hashed: list[str], ncb: int | None) -> list[str]:
    w = max([4] + [len(x) for x in ids])

    def row(name: str, cells: list[str]) -> str:
        return f"  {name:<8}" + " ".join(c.rjust(w) for c in cells)

    return [
        f"  {rid}: num_cached_block={ncb if ncb is not None else 'absent'}",
        row("index", [str(i) for i in range(len(ids))]),
        row("block", ids),
        row("ref_cnt", refs),
        row("hashed", hashed),
    ]
