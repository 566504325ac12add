"""What the record/shadow plugin reads from an engine's scheduler (harness/vllm_sched/record.py):
the running release's profile stamped on the config, and the retention interval the engine builds
by default (0.32 on) refused for sliding-window groups, where kvspec models dense retention only."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from kvspec.harness.targets.base import Unsupported  # noqa: E402
from kvspec.harness.vllm_sched.record import running_profile, spec_config_of  # noqa: E402


def _scheduler(kinds: list[str], retention: int | None) -> Any:
    specs = {
        "full": SimpleNamespace(block_size=32),
        "swa": SimpleNamespace(block_size=32, sliding_window=64),
    }
    groups = []
    for k in kinds:
        cls = type("FullAttentionSpec" if k == "full" else "SlidingWindowSpec", (), {})
        spec = cls()
        spec.__dict__.update(vars(specs[k]))
        groups.append(SimpleNamespace(kv_cache_spec=spec))
    return SimpleNamespace(
        kv_cache_config=SimpleNamespace(
            kv_cache_groups=groups, num_blocks=16, prefix_cache_retention_interval=retention
        ),
        cache_config=SimpleNamespace(enable_prefix_caching=True, prefix_caching_hash_algo="sha256"),
        enable_kv_cache_events=False,
        kv_cache_manager=SimpleNamespace(),
        max_model_len=256,
        scheduler_config=SimpleNamespace(watermark=0.0),
        vllm_config=SimpleNamespace(max_in_flight_tokens=2048),
        hash_block_size=32,
        block_size=32,
    )


def test_the_running_release_is_stamped_on_the_config() -> None:
    config = spec_config_of(_scheduler(["full"], None))
    assert config.profile == running_profile()


@pytest.mark.parametrize("kinds", [["swa"], ["swa", "full"]])
@pytest.mark.parametrize("retention", [0, 64])
def test_sparse_retention_of_sliding_window_groups_is_refused_with_the_way_out(
    kinds: list[str], retention: int
) -> None:
    with pytest.raises(
        Unsupported, match=r"prefix_cache_retention_interval=\d+ .*prefix_cache_retention_interval=None"
    ):
        spec_config_of(_scheduler(kinds, retention))


def test_dense_retention_and_full_attention_alone_are_modelled() -> None:
    assert spec_config_of(_scheduler(["swa", "full"], None)).groups[0].kind == "sliding_window"
    assert spec_config_of(_scheduler(["full"], 0)).groups[0].kind == "full"  # vLLM ignores it there
