"""ci/setup --sglang's check of the sglang venv: SGLang VERSION imports through kvspec's loader (its
CPU shims, harness/sglang/load.py), and the sglang target runs one request through SGLang's radix
cache on the CPU: admitted, computed, finished, its prompt then matched by a second request.

    python ci/sglang/check_import.py VERSION      (exit 0, or 1 saying what failed)
"""

from __future__ import annotations

import sys


def main(version: str) -> int:
    from kvspec.harness.core import ops as O
    from kvspec.harness.sglang.load import SglangUnavailable, load_sglang
    from kvspec.harness.sglang.target import SglangTarget
    from kvspec.spec.config import KVCacheConfig, full_attention

    try:
        found = load_sglang()["version"]
    except SglangUnavailable as e:
        print(f"ci/sglang/check_import.py: {e}", file=sys.stderr)
        return 1
    if found != version:
        print(f"ci/sglang/check_import.py: SGLang {found} is installed, not {version}", file=sys.stderr)
        return 1
    t = SglangTarget()
    t.reset(KVCacheConfig(16, (full_attention(4),), 64))
    prompt = tuple(range(1, 11))
    for op in (
        O.AddRequest("a", prompt),
        O.GetComputedBlocks("a"),
        O.AllocateSlots("a", 10, use_computed_blocks=True),
        O.SetNumComputedTokens("a", 10),
        O.AppendOutputTokens("a", (11,)),
        O.Free("a"),
        O.AddRequest("b", prompt),
    ):
        t.apply(op)
    hit = t.apply(O.GetComputedBlocks("b"))["num_hit_tokens"]
    if hit != 8:
        print(
            f"ci/sglang/check_import.py: a repeated 10-token prompt hit {hit} tokens of 4-token pages, not 8",
            file=sys.stderr,
        )
        return 1
    print(f"ci/sglang/check_import.py: SGLang {found} runs on the CPU ({t.version})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
