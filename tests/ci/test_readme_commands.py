"""The README's commands work as written: every line of its "Two commands" and "Everyday commands"
blocks has a plan here (a line with no plan, or a plan with no line, fails the default tier), and
each plan runs its line, exits as the plan says and prints what it names.

A line runs as the README writes it, with three kinds of edit, each stated in its plan: a time budget
lowered (``--seconds``), a placeholder filled (``<finding>``), an output moved to a temp folder.  It
runs from a temp folder linking the checkout's top-level entries (so reports, ``bench.json`` and
``trace.json`` land there, not in the checkout); ``ci/setup`` parts of a line run in the checkout
itself, as the README means them.  Lines not run say why (a GPU, a model server, the test command
itself) and name the test that covers them instead.  Most plans run in the full tier: each starts
torch or vLLM, and together they take minutes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from ci_helpers import REPO

README = REPO / "README.md"
SECTIONS = ("## Two commands", "## Everyday commands")
FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
OUTPUTS = {"kvspec-reports", ".hypothesis", "bench.json", "trace.json"}  # written by the commands: not linked


def readme_commands() -> list[str]:
    """Each command line of the README's two command blocks, its comment cut off, in order."""
    text = README.read_text()
    lines: list[str] = []
    for title in SECTIONS:
        start = text.index(title)
        section = text[start : text.index("\n## ", start + 1)]
        for body in FENCE.findall(section):
            for raw in body.splitlines():
                line = raw.split("  #", 1)[0].strip()
                if line and not line.startswith("#"):
                    lines.append(line)
    return lines


@dataclass(frozen=True)
class Plan:
    run: str | None  # what runs: the line with the edits named in ``edit`` (None: not run, see ``why``)
    expect: tuple[str, ...] = ()  # regular expressions its output (stdout or stderr) must match, each
    status: int = 0
    edit: str = ""  # the edits made to the README's line, in words
    why: str = ""  # why a line is not run, and which test covers it
    default: bool = False  # also in the default tier (cheap: no vLLM start-up)
    needs: str = ""  # "vllm", "sglang", "engine": skipped, saying so, where it is not installed


SECONDS = "--seconds lowered to fit the test tier"
PLANS: dict[str, Plan] = {
    "bash ci/setup --vllm=0.34.0 && .venv/bin/kvspec fuzz --target vllm --family all --seconds 60": Plan(
        "bash ci/setup --vllm=0.34.0 && .venv/bin/kvspec fuzz --target vllm --family all --seconds 8",
        (r"kvspec fuzz: no finding; target vllm",),
        edit=SECONDS,
        needs="vllm",
    ),
    "bash ci/test": Plan(None, why="the test command itself: .ci/run runs it, and with it this test"),
    ".venv/bin/kvspec fuzz --target vllm --family sliding_window,hybrid_diff --seconds 300 --seed 1": Plan(
        ".venv/bin/kvspec fuzz --target vllm --family sliding_window,hybrid_diff --seconds 6 --seed 1",
        (r"kvspec fuzz: no finding; target vllm, \d+ examples",),
        edit=SECONDS,
        needs="vllm",
    ),
    ".venv/bin/kvspec fuzz --target impl --kv-check --seconds 120": Plan(
        ".venv/bin/kvspec fuzz --target impl --kv-check --seconds 20",
        (r"kvspec fuzz: no finding; target impl",),
        edit=SECONDS,
    ),
    ".venv/bin/kvspec fuzz --target examples.my_manager:make_target": Plan(
        ".venv/bin/kvspec fuzz --target examples.my_manager:make_target --seconds 10",
        (r"relation invariants \(declared by target examples\.my_manager:make_target", "kvspec fuzz: no finding"),
        edit="--seconds 10 added (the default is 60)",
        default=True,
    ),
    ".venv/bin/kvspec fuzz --target vllm-fixed --relation invariants": Plan(
        ".venv/bin/kvspec fuzz --target vllm-fixed --relation invariants --seconds 8",
        (r"kvspec fuzz: no finding; target vllm-fixed",),
        edit="--seconds 8 added (the default is 60)",
        needs="vllm",
    ),
    ".venv/bin/kvspec fuzz --target vllm-scheduler --family all": Plan(
        ".venv/bin/kvspec fuzz --target vllm-scheduler --family all --seconds 10",
        (r"kvspec fuzz: no finding; target vllm-scheduler",),
        edit="--seconds 10 added (the default is 60)",
        needs="vllm",
    ),
    "KVSPEC_RECORD=trace.json vllm serve ...": Plan(
        None, why="`...` stands for a model; tests/engine/test_engine_plugin.py records a real engine so (full tier)"
    ),
    "KVSPEC_SHADOW=1 vllm serve ...": Plan(
        None, why="`...` stands for a model; tests/engine/test_engine_plugin.py shadows a real engine so (full tier)"
    ),
    "bash ci/setup --engine && .venv/bin/kvspec engine --seconds 60": Plan(
        "bash ci/setup --engine && .venv/bin/kvspec engine --seconds 30",
        (r"kvspec fuzz: no finding; target vllm-engine",),
        edit=SECONDS,
        needs="engine",
    ),
    "bash ci/setup --sglang && .venv/bin/kvspec fuzz --target sglang --family all --seconds 60": Plan(
        "bash ci/setup --sglang && .venv/bin/kvspec fuzz --target sglang --family all --seconds 8",
        (r"kvspec fuzz: no finding; target sglang",),
        edit=SECONDS,
        needs="sglang",
    ),
    ".venv/bin/python -m kvspec.harness.vllm_sched.agreement --seconds 600": Plan(
        ".venv/bin/python -m kvspec.harness.vllm_sched.agreement --seconds 10",
        (r"runs (\d+): \1 agree",),
        edit=SECONDS,
        needs="vllm",
    ),
    ".venv/bin/kvspec replay tests/corpus/": Plan(
        ".venv/bin/kvspec replay tests/corpus/",
        (r"kvspec replay: (\d+)/\1 trace\(s\) behaved as recorded",),
        default=True,
    ),
    ".venv/bin/kvspec report kvspec-reports/<finding>/": Plan(
        ".venv/bin/kvspec fuzz --target mutant:free_order_appended --family full --seconds 20 --seed 1 >/dev/null 2>&1;"
        ' test "$?" = 1 && .venv/bin/kvspec report kvspec-reports/*/',
        (r"^# kvspec report: divergence on target `mutant:free_order_appended`",),
        edit="<finding> filled: a finding made first, of a deliberate bug (a spec mutant)",
        default=True,
    ),
    ".venv/bin/kvspec prove": Plan(".venv/bin/kvspec prove", (r"(\d+) claims in [\d.]+s: \1 proven",)),
    ".venv/bin/kvspec mutants": Plan(
        None,
        why="the whole catalogue, 5 minutes: tests/ci/test_ci_mutants.py::test_the_whole_catalogue_is_killed runs "
        "this line with --seconds 60 --shrink-seconds 3 (full tier)",
    ),
    ".venv/bin/kvspec pd check --seconds 60": Plan(
        ".venv/bin/kvspec pd check --seconds 5", (r"kvspec pd check: ",), edit=SECONDS
    ),
    ".venv/bin/kvspec pd verify": Plan(".venv/bin/kvspec pd verify", (r"every rule holds",)),
    ".venv/bin/kvspec pd simulate --out docs/figures": Plan(
        ".venv/bin/kvspec pd simulate --out pd-figures --quick --no-measure",
        (r"wrote",),
        edit="--out to a temp folder (docs/figures is tracked), --quick --no-measure (a small sweep)",
    ),
    ".venv/bin/python -m kvspec.harness.bench allocator --json bench.json": Plan(
        ".venv/bin/python -m kvspec.harness.bench allocator --json bench.json && test -s bench.json",
        (r"impl",),
        needs="vllm",
    ),
    ".venv/bin/python -m kvspec.harness.bench lockstep --target vllm": Plan(
        ".venv/bin/python -m kvspec.harness.bench lockstep --target vllm --examples 3",
        (r"lockstep",),
        edit="--examples 3 added (fewer Hypothesis examples per family)",
        needs="vllm",
    ),
    "bash ci/fuzz-vllm --seconds 600": Plan(
        "bash ci/fuzz-vllm --seconds 10", (r"kvspec fuzz: no finding",), edit=SECONDS, needs="vllm"
    ),
    "bash ci/gpu-check": Plan(
        None,
        why="needs CUDA: the GPU sessions run it (CI has none); tests/impl/test_impl_paged_attention.py's gpu tests",
    ),
}


def test_every_readme_command_has_a_plan():
    """A new README line needs a plan; a plan whose line left the README goes with it."""
    lines = readme_commands()
    assert len(lines) == len(set(lines)), "a README command appears twice"
    assert [line for line in lines if line not in PLANS] == [], "README commands this test does not know"
    assert [line for line in PLANS if line not in lines] == [], "plans for lines the README no longer has"
    for line, plan in PLANS.items():
        assert (plan.run is None) == bool(plan.why), line
        if plan.run is not None and plan.run != line and " && test " not in plan.run:
            assert plan.edit, f"{line}: runs something else without saying what was changed"


def _workdir(tmp: Path) -> Path:
    """A folder that looks like the checkout (its top-level entries linked), where outputs land."""
    work = tmp / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in OUTPUTS and entry.name != ".git":
            (work / entry.name).symlink_to(entry)
    return work


def _needs(plan: Plan) -> list[pytest.MarkDecorator]:
    marks = [] if plan.default else [pytest.mark.full]
    if plan.needs == "vllm":
        marks.append(pytest.mark.vllm)
    elif plan.needs in ("sglang", "engine"):
        venv = REPO / f".venv-{plan.needs}"
        marks.append(pytest.mark.skipif(not venv.is_dir(), reason=f"no {venv.name} (bash ci/setup --{plan.needs})"))
    return marks


def _split_setup(command: str) -> tuple[str | None, str]:
    """``bash ci/setup ... && rest``: the setup part (run in the checkout) and the rest."""
    if command.startswith("bash ci/setup ") and " && " in command:
        setup, rest = command.split(" && ", 1)
        return setup, rest
    return None, command


RUNNABLE = [(line, plan) for line, plan in PLANS.items() if plan.run is not None]


def _id(line: str) -> str:
    """``.venv/bin/kvspec fuzz --target impl --kv-check ...`` -> ``kvspec-fuzz--target-impl--kv-check``."""
    words = [w.rsplit("/", 1)[-1] for w in shlex.split(line) if not re.fullmatch(r"[\d.]+|&&", w)]
    return re.sub(r"[^\w.-]+", "-", " ".join(words))[:60]


@pytest.mark.parametrize(
    ("line", "plan"), [pytest.param(line, plan, marks=_needs(plan), id=_id(line)) for line, plan in RUNNABLE]
)
def test_a_readme_command_runs_as_written(line, plan, tmp_path):
    assert plan.run is not None
    setup, command = _split_setup(plan.run)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSPEC_")}
    if setup is not None:
        r = subprocess.run(["bash", "-c", setup], cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)
        assert r.returncode == 0, (setup, r.stdout[-2000:], r.stderr[-2000:])
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=_workdir(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    out = r.stdout + r.stderr
    assert r.returncode == plan.status, (command, r.returncode, out[-3000:])
    for pattern in plan.expect:
        assert re.search(pattern, r.stdout, re.M) or re.search(pattern, r.stderr, re.M), (command, pattern, out[-3000:])


def test_the_readme_sample_is_the_report_of_its_trace():
    """The README's sample finding is what ``kvspec report`` renders from ``docs/sample-finding/``,
    line for line, and that trace is K3's."""
    from kvspec.harness.traces.report import render_report
    from kvspec.harness.traces.trace import read_trace

    text = README.read_text()
    section = text[text.index("## What a finding looks like") :]
    (sample,) = re.findall(r"^````text\n(.*?)^````", section, re.M | re.S)[:1]
    rendered = render_report(read_trace(REPO / "docs" / "sample-finding")).splitlines()
    lines = sample.splitlines()
    start = rendered.index(lines[0])
    assert rendered[start : start + 3] == lines[:3]
    steps = rendered.index(next(line for line in lines if line.startswith("## Steps")))
    assert rendered[steps : steps + len(lines) - 4] == lines[4:]
    assert "known bug K3" in lines[0]
