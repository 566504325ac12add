"""``--target`` resolution: built-ins, user factories, and a clear error for each way it can fail."""

import sys
import types

import pytest

from harness.cli import main
from harness.targets import TargetLoadError, load_target
from harness.targets.spec import SpecTarget


def test_spec_target_loads():
    assert isinstance(load_target("spec"), SpecTarget)


def test_user_example_adapter_loads():
    t = load_target("examples.my_manager:make_target")
    assert t.name == "my_manager"


@pytest.fixture
def fake_module(monkeypatch):
    mod = types.ModuleType("kvspec_fake_targets")
    mod.raises = lambda: (_ for _ in ()).throw(RuntimeError("no GPU here"))
    mod.not_a_target = lambda: object()
    mod.value = 3
    mod.good = SpecTarget
    monkeypatch.setitem(sys.modules, "kvspec_fake_targets", mod)
    return mod


@pytest.mark.parametrize(
    "name, needle",
    [
        ("no_such_pkg.mod:f", "module 'no_such_pkg' not found"),
        ("kvspec_fake_targets:missing", "has no attribute 'missing'"),
        ("kvspec_fake_targets:value", "is not callable"),
        ("kvspec_fake_targets:raises", "its factory raised RuntimeError: no GPU here"),
        ("kvspec_fake_targets:not_a_target", "lacks name, version, reset, apply, observe"),
        ("vllmish", "unknown target 'vllmish'"),
        ("mutant:free_order_appended", "module 'mutant' not found"),
    ],
)
def test_bad_target_says_why(fake_module, name, needle):
    """The production registry knows no deliberate bugs: ``mutant:NAME`` is not a target there."""
    with pytest.raises(TargetLoadError) as e:
        load_target(name)
    assert needle in str(e.value)


def test_cli_resolves_mutants_from_their_catalogue(capsys):
    from harness.mutants.registry import resolve_target

    assert resolve_target("mutant:free_order_appended")().name == "mutant:free_order_appended"
    assert resolve_target("mutant:window_off_by_one")().name == "mutant:window_off_by_one"  # an impl mutant
    with pytest.raises(TargetLoadError, match="unknown mutant 'nope'"):
        resolve_target("mutant:nope")
    assert main(["fuzz", "--target", "mutant:nope", "--seconds", "1"]) == 2
    assert "unknown mutant 'nope'" in capsys.readouterr().err


def test_production_registry_does_not_import_the_mutants():
    import subprocess

    code = "import sys, harness.targets as t; t.load_target('spec'); print('harness.mutants.registry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_good_user_factory(fake_module):
    assert isinstance(load_target("kvspec_fake_targets:good"), SpecTarget)


def test_cli_exits_2_on_unloadable_target(fake_module, capsys):
    assert main(["fuzz", "--target", "kvspec_fake_targets:raises", "--seconds", "1"]) == 2
    assert "no GPU here" in capsys.readouterr().err


def test_cli_usage_errors_exit_2(capsys, tmp_path):
    assert main(["fuzz", "--family", "fullish", "--seconds", "1"]) == 2
    assert "unknown family fullish" in capsys.readouterr().err
    assert main(["fuzz", "--relation", "roughly", "--seconds", "1"]) == 2
    assert main(["frobnicate"]) == 2
