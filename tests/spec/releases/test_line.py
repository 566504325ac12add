"""The release line (spec/releases): profiles computed from the per-release changes."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from kvspec.spec.releases.line import (
    BASE_RELEASE,
    CHANGES,
    RELEASES,
    UnknownRelease,
    changes_between,
    nearest_releases,
    profile_for,
    profile_named,
    require_known,
    version_key,
)
from kvspec.spec.releases.profile import BASE, Profile

HERE = Path(__file__).parent


def test_the_base_release_is_the_base_reading() -> None:
    """0.33.0's profile sets every knob to its default: the spec's code is 0.33.0's reading."""
    assert profile_for(BASE_RELEASE).knobs() == BASE.knobs()
    assert profile_for(BASE_RELEASE).changes == ()


def test_each_release_module_lists_only_its_own_changes() -> None:
    for change in CHANGES:
        assert change.release in RELEASES, change
        module = importlib.import_module("kvspec.spec.releases.v" + "_".join(change.release.split(".")[:2]))
        assert change in module.CHANGES, (change.name, module.__name__)
    assert len({c.name for c in CHANGES}) == len(CHANGES), "change names are unique"


def test_changes_of_one_knob_come_in_release_order_and_chain() -> None:
    """A later change of a knob starts from the value the earlier one left."""
    by_knob: dict[str, list] = {}
    for change in CHANGES:
        assert change.knob in BASE.knobs(), change
        by_knob.setdefault(change.knob, []).append(change)
    for knob, chain in by_knob.items():
        keys = [version_key(c.release) for c in chain]
        assert keys == sorted(keys), knob
        for earlier, later in zip(chain, chain[1:]):
            assert earlier.after == later.before, (knob, earlier.name, later.name)


def test_a_release_differs_from_its_predecessor_by_its_own_changes() -> None:
    for old, new in zip(RELEASES, RELEASES[1:]):
        made = changes_between(old, new)
        assert all(c.release == new for c in made)
        a, b = profile_for(old).knobs(), profile_for(new).knobs()
        assert {k for k in a if a[k] != b[k]} == {c.knob for c in made if c.before != c.after}, (old, new)


def test_every_change_is_tested_by_name() -> None:
    """Each change has a test that names it (and fails when the change is removed)."""
    text = "".join(p.read_text() for p in HERE.glob("test_*.py") if p.name != Path(__file__).name)
    missing = [c.name for c in CHANGES if c.name not in text]
    assert not missing, f"changes without a test naming them: {missing}"


def test_unknown_releases_name_the_nearest_known_ones() -> None:
    assert nearest_releases("0.33.5") == ("0.33.0", "0.34.0")
    assert nearest_releases("0.35.0") == ("0.34.0", None)
    with pytest.raises(UnknownRelease, match=r"0\.35\.0 .*nearest: 0\.34\.0"):
        require_known("0.35.0")
    with pytest.raises(UnknownRelease, match="not a vLLM version"):
        version_key("latest")
    assert version_key("0.34.0+cpu") == (0, 34, 0)


def test_profiles_by_name() -> None:
    assert profile_named("vllm-0.33") == profile_for("0.33.0")  # the name older traces carry
    assert isinstance(profile_named("vllm-0.20-free-order"), Profile)
    for release in RELEASES:
        assert profile_named(f"vllm-{release}") == profile_for(release)
    with pytest.raises(UnknownRelease):
        profile_named("vllm-9.9.9")
