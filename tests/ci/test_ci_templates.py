"""The CI templates (ci/templates/) are valid and the kvspec commands inside them run here.

Validity: ``check-jsonschema`` with its bundled GitHub-workflow and GitLab-CI schemas (no network).
Commands: every ``run:`` block / ``script:`` line that calls kvspec is run with bash, in a scratch
project, with the templates' own variables set to tiny budgets; on the spec (nothing to find) each
passes and writes valid JUnit XML; on a deliberate bug the fuzz command fails and its JUnit names it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from ci_helpers import REPO, VENV_BIN, env

from kvspec.spec.releases.line import RELEASES

TEMPLATES = REPO / "ci" / "templates"
GITHUB = TEMPLATES / "github-kvspec.yml"
GITLAB = TEMPLATES / "gitlab-kvspec.yml"
CHECK = shutil.which("check-jsonschema", path=str(VENV_BIN)) or shutil.which("check-jsonschema")
CALLS_KVSPEC = re.compile(r"(?:^|[;&|]|\bthen|\bdo)\s*kvspec\s", re.M)  # a kvspec command, not the word
needs_checker = pytest.mark.skipif(CHECK is None, reason="check-jsonschema is not installed (ci/requirements.txt)")


def validate(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    assert CHECK is not None
    return subprocess.run([CHECK, "--builtin-schema", schema, str(path)], text=True, capture_output=True, timeout=120)


@needs_checker
@pytest.mark.parametrize("path,schema", [(GITHUB, "vendor.github-workflows"), (GITLAB, "vendor.gitlab-ci")])
def test_template_validates(path, schema, tmp_path):
    r = validate(path, schema)
    assert r.returncode == 0, r.stdout + r.stderr
    # Teeth: the same validator rejects a broken copy.
    broken = tmp_path / path.name
    text = path.read_text()
    broken.write_text(
        text.replace("runs-on:", "runs-onn:", 1)
        if path == GITHUB
        else text.replace("  timeout: 30m", "  timeoutt: 30m", 1)
    )
    assert validate(broken, schema).returncode != 0


def github_blocks() -> dict[str, list[str]]:
    """job -> the ``run:`` blocks that call kvspec, in order."""
    doc = yaml.safe_load(GITHUB.read_text())
    return {
        job: [s["run"] for s in spec["steps"] if CALLS_KVSPEC.search(s.get("run", ""))]
        for job, spec in doc["jobs"].items()
    }


def gitlab_blocks() -> dict[str, list[str]]:
    doc = yaml.safe_load(GITLAB.read_text())
    out = {}
    for job, spec in doc.items():
        if isinstance(spec, dict) and ("script" in spec or "after_script" in spec) and not job.startswith("."):
            lines = [*spec.get("script", []), *spec.get("after_script", [])]
            out[job] = [line for line in lines if CALLS_KVSPEC.search(line)]
    return out


def variables(target: str) -> dict[str, str]:
    """The templates' variables for a scratch run: tiny budgets, this repository's corpus."""
    return {
        "KVSPEC_TARGET": target,
        "KVSPEC_FAMILY": "full",
        "KVSPEC_RELATION": "exact",
        "KVSPEC_CORPUS": "corpus",
        "KVSPEC_DB": ".hypothesis/examples",
        "KVSPEC_PR_SECONDS": "2",
        "KVSPEC_NIGHTLY_SECONDS": "3",
        "KVSPEC_WORKERS": "2",
        "KVSPEC_SHRINK_SECONDS": "2",
    }


def scratch(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "corpus").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "corpus" / "hits_not_touched.json", proj / "corpus")
    return proj


def run_block(block: str, proj: Path, target: str) -> subprocess.CompletedProcess[str]:
    # GitHub's default shell (bash -eo pipefail) and GitLab's (each line with errexit).
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", block],
        cwd=proj,
        env=env(**variables(target)),
        text=True,
        capture_output=True,
        timeout=180,
    )


def junit_cases(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites" and root[0].tag == "testsuite"
    return list(root[0].iter("testcase"))


def test_the_templates_hold_kvspec_commands():
    gh, gl = github_blocks(), gitlab_blocks()
    assert len(gh["pull-request"]) == 2 and len(gh["nightly"]) == 2, gh
    assert len(gl["kvspec:merge-request"]) == 2 and len(gl["kvspec:nightly"]) == 2, gl
    for block in [*sum(gh.values(), []), *sum(gl.values(), [])]:
        assert "${{" not in block, "run blocks must be plain shell"


def test_the_release_matrix_is_every_release_kvspec_models():
    """Both templates' nightly release matrix (and ``ci/setup --list-vllm``) list exactly the releases
    of ``spec.releases.line.RELEASES``: adding a release there without the matrix fails here."""
    gh = yaml.safe_load(GITHUB.read_text())["jobs"]["vllm-releases"]
    gl = yaml.safe_load(GITLAB.read_text())["kvspec:vllm-releases"]
    assert tuple(gh["strategy"]["matrix"]["vllm"]) == RELEASES
    assert tuple(gl["parallel"]["matrix"][0]["KVSPEC_VLLM"]) == RELEASES
    listed = subprocess.run(["bash", "ci/setup", "--list-vllm"], capture_output=True, text=True, check=True, cwd=REPO)
    assert tuple(listed.stdout.split()) == RELEASES
    for lines in ("\n".join(s.get("run", "") for s in gh["steps"]), "\n".join(gl["script"])):
        assert 'ci/setup --vllm="$KVSPEC_VLLM"' in lines and "kvspec fuzz --target vllm --family all" in lines
        assert "${{" not in lines, "run blocks must be plain shell"


def test_github_pull_request_commands_run(tmp_path):
    proj = scratch(tmp_path)
    for block in github_blocks()["pull-request"]:
        r = run_block(block, proj, "spec")
        assert r.returncode == 0, (block, r.stdout, r.stderr)
    replay = junit_cases(proj / "reports" / "kvspec-replay.xml")
    assert [c.get("name") for c in replay] == ["corpus/hits_not_touched.json"]
    fuzz = junit_cases(proj / "reports" / "kvspec-fuzz.xml")
    assert [c.get("name") for c in fuzz] == ["full"] and not fuzz[0].findall("failure")


def test_gitlab_nightly_commands_run_and_report_a_bug(tmp_path):
    """On a deliberate bug the nightly fuzz fails, its JUnit names the report, and the corpus step
    adds the shrunk trace."""
    proj = scratch(tmp_path)
    fuzz, collect = gitlab_blocks()["kvspec:nightly"]
    r = run_block(fuzz, proj, "mutant:hits_not_touched")
    assert r.returncode == 1, (r.stdout, r.stderr)
    (case,) = junit_cases(proj / "reports" / "kvspec-nightly.xml")
    (failure,) = case.findall("failure")
    assert "report: kvspec-reports/" in (failure.text or "")
    assert run_block(collect, proj, "mutant:hits_not_touched").returncode == 0
    added = sorted(p.name for p in (proj / "corpus").glob("kvspec-*.json"))
    assert len(added) == 1, added


# --- install, pip cache and permissions, as the templates render them --------------------------------

INSTALL_KVSPEC = 'python -m pip install "kvspec @ git+$KVSPEC_GIT@$KVSPEC_REF"'
INSTALL_TORCH = 'python -m pip install --index-url "$KVSPEC_TORCH_INDEX" torch'
# What each action the GitHub workflow uses needs of the job's token (a job's ``permissions:`` replaces
# the workflow's; a scope left out is none).
NEEDS = {
    "actions/checkout": {"contents": "read"},
    "mikepenz/action-junit-report": {"checks": "write"},
    "peter-evans/create-pull-request": {"contents": "write", "pull-requests": "write"},
    "github/codeql-action/upload-sarif": {"security-events": "write"},
}
LEVEL = {"none": 0, "read": 1, "write": 2}


def install_lines(lines: list[str]) -> list[str]:
    """The pip lines of a job's install step, in order."""
    return [line.strip() for line in lines if "pip install" in line]


def test_github_jobs_install_kvspec_from_its_pinned_commit_with_cpu_torch_and_a_pip_cache():
    doc = yaml.safe_load(GITHUB.read_text())
    assert doc["env"]["KVSPEC_TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    for job in ("pull-request", "nightly"):
        steps = doc["jobs"][job]["steps"]
        (setup,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
        assert setup["with"]["cache"] == "pip", job
        assert ".github/workflows/kvspec.yml" in setup["with"]["cache-dependency-path"].split(), job  # the pin
        (install,) = [s["run"] for s in steps if "pip install" in s.get("run", "")]
        lines = install_lines(install.splitlines())
        # CPU torch first, so kvspec's torch requirement is met without a CUDA build; never `pip install kvspec`.
        assert lines == [INSTALL_TORCH, INSTALL_KVSPEC, "python -m pip install -e ."], (job, lines)


def test_gitlab_jobs_install_kvspec_from_its_pinned_commit_with_cpu_torch_and_a_pip_cache():
    doc = yaml.safe_load(GITLAB.read_text())
    base = doc[".kvspec"]
    assert install_lines(base["before_script"]) == [INSTALL_TORCH, INSTALL_KVSPEC, "python -m pip install -e ."]
    assert doc["variables"]["PIP_CACHE_DIR"] == "$CI_PROJECT_DIR/.cache/pip"
    (pip_cache,) = [c for c in base["cache"] if ".cache/pip" in c["paths"]]
    assert "$KVSPEC_REF" in pip_cache["key"]  # a new pin, a new cache
    for job in ("kvspec:merge-request", "kvspec:nightly"):
        assert doc[job]["extends"] == ".kvspec"


def test_github_jobs_grant_what_their_actions_need_and_no_more():
    doc = yaml.safe_load(GITHUB.read_text())
    assert doc["permissions"] == {"contents": "read"}, "the workflow's default token: read only"
    for name, job in doc["jobs"].items():
        granted = job.get("permissions", doc["permissions"])
        needed: dict[str, str] = {}
        for step in job["steps"]:
            action = step.get("uses", "").split("@")[0]
            for scope, level in NEEDS.get(action, {}).items():
                if LEVEL[level] > LEVEL[needed.get(scope, "none")]:
                    needed[scope] = level
        for scope, level in needed.items():
            assert LEVEL[granted.get(scope, "none")] >= LEVEL[level], (name, scope, granted)
        assert set(granted) <= set(needed) | {"contents"}, (name, granted, needed)


def test_the_templates_install_line_is_the_one_the_user_repo_test_runs():
    """docs/ci.md's install line, run as written by tests/ci/test_ci_user_repo.py, is the templates'."""
    from user_repo import documented_commands

    assert INSTALL_KVSPEC in [c.line for c in documented_commands()]
