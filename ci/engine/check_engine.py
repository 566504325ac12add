"""Import check of the engine venv (ci/setup --engine): vLLM's CPU build imports and sees the CPU
platform, and the tiny models are written (harness/engine/models.py)."""

import os
import sys
from pathlib import Path

assert os.environ.get("VLLM_TARGET_DEVICE") == "cpu", "the engine venv says CPU for its processes (ci/setup)"
import vllm  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

from kvspec.harness.engine.models import MODEL_KINDS, write_model  # noqa: E402

if not current_platform.is_cpu():
    sys.exit(f"ci/setup --engine: vLLM {vllm.__version__} does not see the CPU platform ({current_platform})")
for kind in MODEL_KINDS:
    write_model(kind, Path(sys.argv[1]))
kinds = ", ".join(MODEL_KINDS)
print(f"ci/setup: engine venv ready: vLLM {vllm.__version__} (CPU build), models {kinds} in {sys.argv[1]}")
