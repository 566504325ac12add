"""``--target`` resolution in the one resolver (``harness.run.catalogue.resolve``): built-ins, mutants,
user factories, and a clear error for each way it can fail."""

import sys
import types

import pytest

from kvspec.harness.cli import main
from kvspec.harness.run.catalogue import BUILTIN, resolve
from kvspec.harness.targets import TargetLoadError
from kvspec.harness.targets.spec import SpecTarget


def load_target(name: str) -> object:
    return resolve(name).factory()


def test_spec_target_loads():
    assert isinstance(load_target("spec"), SpecTarget)


def test_user_example_adapter_loads():
    t = load_target("examples.my_manager:make_target")
    assert t.name == "my_manager"


def test_every_built_in_name_is_one_catalogue_entry():
    """The built-in names live in one place: the catalogue (``--help`` and the errors name them from it)."""
    assert set(BUILTIN) == {"spec", "vllm", "impl", "vllm-fixed", "vllm-scheduler", "vllm-engine", "sglang"}
    entry = resolve("spec")
    assert (entry.name, entry.relation, entry.origin, entry.builtin) == ("spec", "exact", "spec", True)
    assert not resolve("examples.my_manager:make_target").builtin


@pytest.fixture
def fake_module(monkeypatch):
    mod = types.ModuleType("kvspec_fake_targets")
    mod.raises = lambda: (_ for _ in ()).throw(RuntimeError("no GPU here"))
    mod.not_a_target = lambda: object()
    mod.value = 3
    mod.good = SpecTarget
    mod.exits = lambda: sys.exit(3)
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
        ("vllmish", "unknown target 'vllmish'; did you mean vllm?"),
        ("sglnag", "unknown target 'sglnag'; did you mean sglang?"),
        ("VLLM_Scheduler", "unknown target 'VLLM_Scheduler'; did you mean vllm-scheduler?"),
        ("mutant:nope", "unknown mutant 'nope' (known:"),
        ("mutant:cache_draft", "unknown mutant 'cache_draft'; did you mean cache_drafts?"),
        ("kvspec_fake_targets:exits", "loading it raised SystemExit"),
    ],
)
def test_bad_target_says_why(fake_module, name, needle):
    with pytest.raises(TargetLoadError) as e:
        load_target(name)
    assert needle in str(e.value)


def test_cli_resolves_mutants_from_their_catalogue(capsys):
    assert load_target("mutant:free_order_appended").name == "mutant:free_order_appended"
    assert load_target("mutant:window_off_by_one").name == "mutant:window_off_by_one"  # an impl mutant
    with pytest.raises(TargetLoadError, match="unknown mutant 'nope'"):
        resolve("mutant:nope")
    assert main(["fuzz", "--target", "mutant:nope", "--seconds", "1"]) == 2
    assert "unknown mutant 'nope'" in capsys.readouterr().err


def test_resolving_a_built_in_imports_no_mutant_catalogue():
    import subprocess

    code = "import sys, kvspec.harness.run.catalogue as c; c.resolve('spec')\n"
    code += "print('kvspec.harness.mutants.registry' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_good_user_factory(fake_module):
    assert isinstance(load_target("kvspec_fake_targets:good"), SpecTarget)


def test_cli_exits_2_on_unloadable_target(fake_module, capsys):
    assert main(["fuzz", "--target", "kvspec_fake_targets:raises", "--seconds", "1"]) == 2
    assert "no GPU here" in capsys.readouterr().err


def test_cli_usage_errors_exit_2(capsys, tmp_path):
    assert main(["fuzz", "--family", "fullish", "--seconds", "1"]) == 2
    assert "unknown family fullish; did you mean full?" in capsys.readouterr().err
    assert main(["fuzz", "--family", "slidingwindow", "--seconds", "1"]) == 2
    assert "unknown family slidingwindow; did you mean sliding_window?" in capsys.readouterr().err
    assert main(["fuzz", "--family", "zzz", "--seconds", "1"]) == 2
    assert "unknown family zzz (known:" in capsys.readouterr().err  # nothing close: no guess
    assert main(["fuzz", "--relation", "roughly", "--seconds", "1"]) == 2
    assert main(["frobnicate"]) == 2
