"""The tests stand alone: nothing in ``tests/`` can stand in for a module they skip without.

pytest imports the test files in its default (``prepend``) import mode: ``tests/`` (for its
``conftest.py``) and every test folder without an ``__init__.py`` go to the front of ``sys.path``,
so each folder and module in them is a top-level import name.  A folder named like a module that
may be missing then stands in for it when it is: ``tests/vllm/`` (now ``tests/vllm_target/``)
made ``import vllm`` succeed without vLLM, as an empty namespace package, so every
``pytest.importorskip("vllm")`` passed and the tests behind it failed instead of skipping.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# ``pytest.importorskip("x")`` and ``importlib.util.find_spec("x")``: what the tests may run without.
SKIPPED_ON = re.compile(r"""(?:importorskip|find_spec)\(\s*["']([A-Za-z_][\w.]*)["']""")
# kvspec's own packages (imported as kvspec.*): always there.
OWN = {"spec", "impl", "harness", "kvspec"}


def optional_modules() -> set[str]:
    """The top-level modules the tests (and the replay files the reports write) skip on when absent."""
    names = {"vllm"}  # the ``vllm`` marker's package (tests/conftest.py)
    for path in [*TESTS.rglob("*.py"), *(ROOT / "harness").rglob("*.py")]:
        names.update(m.split(".")[0] for m in SKIPPED_ON.findall(path.read_text()))
    return names - OWN


def folders_on_sys_path() -> list[Path]:
    """The folders pytest puts on ``sys.path``: those holding a ``.py`` file and no ``__init__.py``."""
    folders = [TESTS, *(p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    return [f for f in folders if not (f / "__init__.py").exists() and any(f.glob("*.py"))]


def test_the_scan_finds_the_optional_modules() -> None:
    assert {"vllm", "einops", "redis", "hypofuzz", "triton", "cbor2"} <= optional_modules()


def test_no_folder_or_module_of_the_tests_is_named_like_an_optional_module() -> None:
    optional = optional_modules()
    shadows = [
        str(child.relative_to(ROOT))
        for folder in folders_on_sys_path()
        for child in folder.iterdir()
        if (child.is_dir() and child.name in optional) or (child.suffix == ".py" and child.stem in optional)
    ]
    assert not shadows, f"on sys.path under pytest, these stand in for a missing module of that name: {shadows}"
