"""The layout a newcomer relies on (docs/architecture.md): folders by area, imports one way, small rooms.

Every package under ``harness/`` ends its docstring with an ``Imports:`` line naming the packages
it may import; these tests read the source (every ``import``, also inside functions and under
``if TYPE_CHECKING:``) and hold the code to those lines, to the absence of import cycles between
modules, to at most 12 modules directly in ``harness/``, and to no file over 450 lines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450
MAX_TOP_MODULES = 12
TOP = {"harness.cli", "harness.campaign", "harness.__main__"}  # on top of every layer (names by folder)


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def package_modules(top: str) -> dict[str, Path]:
    """The modules of ``top`` (``spec``, ``impl`` or ``harness``), named by folder."""
    return {module_name(p): p for p in sorted((ROOT / top).rglob("*.py"))}


def harness_modules() -> dict[str, Path]:
    return package_modules("harness")


def imported_names(path: Path) -> Iterator[str]:
    """Every module name an ``import`` statement anywhere in the file names (``from a import b``
    yields ``a`` and ``a.b``: ``b`` may be a module), without the ``kvspec.`` every one of kvspec's
    own starts with (``kvspec.harness.cli`` -> ``harness.cli``, the folder's name)."""
    for name in _imported(path):
        yield name.removeprefix("kvspec.")


def _imported(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_kvspec_is_imported_by_its_one_name_only() -> None:
    """Nothing imports ``spec``, ``impl`` or ``harness`` bare: kvspec installs one import name,
    ``kvspec`` (a user's own ``harness`` or ``spec`` package must not shadow it, nor it them)."""
    bare = [
        f"{p.relative_to(ROOT)}: {name}"
        for folder in ("spec", "impl", "harness", "tests", "examples", "ci")
        for p in sorted((ROOT / folder).rglob("*.py"))
        for name in _imported(p)
        if name.split(".")[0] in ("spec", "impl", "harness")
    ]
    assert not bare, "\n".join(bare)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: {t for t in imported_names(p) if t in modules and t != m} for m, p in modules.items()}


def area(module: str) -> str:
    """The package a module belongs to: ``harness.check.lockstep`` -> ``harness.check``,
    ``impl.allocator.block_pool`` -> ``impl.allocator``; the modules directly in a top folder (and
    the folder itself) -> ``harness``, ``spec``, ``impl``."""
    parts = module.split(".")
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def allowed_imports(package: str) -> set[str]:
    """The ``Imports:`` line of a package's docstring, as a set of package names."""
    doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())) or ""
    m = re.search(r"^Imports:(.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    assert m, f"{package}/__init__.py: its docstring has no 'Imports:' line"
    names = {x.strip().rstrip(".") for x in m.group(1).replace("\n", " ").split(",") if x.strip()}
    return set() if names == {"nothing"} else names


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state and (c := visit(t)):
                return c
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_find_cycle_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(import_graph(harness_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("top", ["spec", "impl", "harness"])
def test_every_package_imports_only_what_its_docstring_allows(top: str) -> None:
    """Each package's modules import only the packages its docstring's ``Imports:`` line names (the
    modules directly in ``harness/`` excepted: they sit on top of every layer)."""
    modules = {**package_modules("spec"), **package_modules("impl"), **harness_modules()}
    bad = []
    for mod, targets in import_graph(modules).items():
        if mod.split(".")[0] != top or mod in TOP or area(mod) == "harness":
            continue
        allowed = allowed_imports(area(mod)) | {area(mod)}
        for t in sorted(targets):
            other_top = t.split(".")[0] != top and t.split(".")[0] in allowed  # ``spec`` allows all of spec/
            if area(t) not in allowed and not other_top and not (t == "harness" and "harness" in allowed):
                bad.append(f"{mod} imports {t} (allowed: {', '.join(sorted(allowed))})")
    assert not bad, "\n".join(bad)


def test_spec_and_impl_never_import_harness() -> None:
    for pkg in ("spec", "impl"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            up = [t for t in imported_names(p) if t == "harness" or t.startswith("harness.")]
            assert not up, f"{p.relative_to(ROOT)} imports {up[0]}"


def test_at_most_twelve_modules_directly_in_harness() -> None:
    top = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize("pkg", ["spec", "impl", "harness"])
def test_no_file_over_450_lines(pkg: str) -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)


@pytest.mark.parametrize("top", ["spec", "impl", "harness"])
def test_every_folder_says_what_lives_there(top: str) -> None:
    for init in sorted((ROOT / top).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 5, f"{init.relative_to(ROOT)} has no docstring saying what lives there"


MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """The functions (methods and nested ones too) of ``source`` longer than ``limit`` lines, from the
    ``def`` line to the last line of the body, decorators not counted: (name, lines)."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_long_functions_are_found() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert long_functions(f"def f():\n{body}\n") == [("f", 61)]
    assert long_functions(f"class C:\n    def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n") == [("m", 61)]
    assert long_functions(f"def f():\n{body[: body.rindex(chr(10))]}\n") == []


def test_no_function_over_sixty_lines_in_harness() -> None:
    """Functions by step, not files by size: a long function becomes named steps (issue 32)."""
    long = [
        f"{p.relative_to(ROOT)}: {name} ({n} lines)"
        for p in sorted((ROOT / "harness").rglob("*.py"))
        for name, n in long_functions(p.read_text())
    ]
    assert not long, "\n".join(long)
