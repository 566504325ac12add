"""The post-install check of ``ci/setup --vllm[=VERSION]``: what kvspec's vLLM adapters import
(harness/targets/vllm.py, harness/vllm_sched/) imports, and ``vllm.__version__`` is the release asked for.

    python -W ignore ci/vllm/check_import.py VERSION [--vllm-under DIR] [--torch-under DIR]

``--vllm-under`` / ``--torch-under``: also check that vllm (torch) is imported from under DIR (a
light venv made with KVSPEC_BASE_VENV: vLLM from the light venv, torch from the base).  Exit 0 and
one line on stdout when all is well; exit 1 naming what failed otherwise.  Runs with no CUDA: the
compiled parts of vLLM are deleted by ci/setup and never loaded on this path.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

# module -> names it must define (what the adapters import from it).
REQUIRED: dict[str, tuple[str, ...]] = {
    "vllm.v1.core.kv_cache_manager": ("KVCacheManager",),
    "vllm.v1.core.kv_cache_utils": ("get_request_block_hasher", "init_none_hash"),
    "vllm.v1.request": ("Request", "RequestStatus"),
    "vllm.distributed.kv_events": (),
    "vllm.v1.kv_cache_interface": ("FullAttentionSpec", "KVCacheConfig", "KVCacheGroupSpec", "SlidingWindowSpec"),
    "vllm.lora.request": ("LoRARequest",),
    "vllm.multimodal.inputs": ("MultiModalFeatureSpec", "PlaceholderRange"),
    "vllm.sampling_params": ("SamplingParams",),
    "vllm.config": ("CacheConfig", "DeviceConfig", "ModelConfig", "SchedulerConfig", "VllmConfig"),
    "vllm.v1.core.sched.scheduler": ("Scheduler",),
}
# Where a release keeps the sha256 block hashers (vllm.utils.hashing since before 0.23.0).
HASHING = ("vllm.utils.hashing", "vllm.utils")


def _under(path: str | None, root: str) -> bool:
    return path is not None and Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("version")
    p.add_argument("--vllm-under")
    p.add_argument("--torch-under")
    a = p.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    problems: list[str] = []
    import torch
    import vllm

    if vllm.__version__ != a.version:
        problems.append(f"vllm.__version__ is {vllm.__version__!r}, expected {a.version!r}")
    if a.vllm_under and not _under(vllm.__file__, a.vllm_under):
        problems.append(f"vllm imported from {vllm.__file__}, expected under {a.vllm_under}")
    if a.torch_under and not _under(torch.__file__, a.torch_under):
        problems.append(f"torch imported from {torch.__file__}, expected under {a.torch_under}")
    if "+cpu" not in torch.__version__:
        problems.append(f"torch {torch.__version__} is not the CPU build")
    for name, attrs in REQUIRED.items():
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the finding here
            problems.append(f"import {name}: {type(e).__name__}: {e}")
            continue
        problems += [f"{name} has no {attr}" for attr in attrs if not hasattr(mod, attr)]
    hashing = None
    for name in HASHING:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "sha256") and hasattr(mod, "sha256_cbor"):
            hashing = name
            break
    if hashing is None:
        problems.append(f"sha256 / sha256_cbor found in none of {', '.join(HASHING)}")
    if problems:
        print(f"ci/vllm/check_import.py: vLLM {a.version}: FAILED", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(
        f"vLLM {vllm.__version__} imports OK from {Path(vllm.__file__).parent} "
        f"(torch {torch.__version__} from {Path(torch.__file__).parent}; sha256 in {hashing})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
