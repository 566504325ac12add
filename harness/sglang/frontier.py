"""Which (page size, window, prompt) leave a request unprotected after its checkpoint (S1):
``python -m kvspec.harness.sglang.frontier`` (docs/upstream/sglang-swa-insert-unprotected.md).

One request per case on the ``sglang`` target: full attention with a sliding window, its prompt
computed in one step, then the checkpoint that follows.  A case is affected when the request's
protected prefix (``cache_protected_len``) is not its prompt's whole pages afterwards.  Run it with
``KVSPEC_SGLANG_VENV`` naming the release to measure.

Imports: harness.core, harness.sglang, spec.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from kvspec.harness.core import ops as O
from kvspec.harness.sglang.load import load_sglang
from kvspec.harness.sglang.target import SglangTarget
from kvspec.spec.config import KVCacheConfig, full_attention, sliding_window
from kvspec.spec.types import BlockCount, TokenCount


def get_protected_len(page: int, window: int, prompt: int) -> int:
    """The request's protected prefix after its prompt's checkpoint."""
    blocks = -(-prompt // page) + 2
    groups = (full_attention(page), sliding_window(page, window))
    t = SglangTarget()
    t.reset(KVCacheConfig(BlockCount(1 + 2 * blocks), groups, TokenCount(prompt + 2 * page)))
    ops: list[O.Op] = [O.AddRequest("a", tuple(range(1, prompt + 1))), O.GetComputedBlocks("a")]
    ops += [O.AllocateSlots("a", prompt, use_computed_blocks=True), O.SetNumComputedTokens("a", prompt)]
    for op in ops + [O.AppendOutputTokens("a", (7,))]:  # the checkpoint runs before the next call
        t.apply(op)
    return int(t.book.get_native("a").req.kv.cache_protected_len)


def find_unprotected(pages: list[int], windows: range, prompts: range) -> dict[tuple[int, int], list[int]]:
    """(page, window) -> the prompt lengths left unprotected."""
    found: dict[tuple[int, int], list[int]] = defaultdict(list)
    for page in pages:
        for window in windows:
            for prompt in prompts:
                if get_protected_len(page, window, prompt) != prompt // page * page:
                    found[page, window].append(prompt)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvspec.harness.sglang.frontier", description=__doc__)
    parser.add_argument("--max-window", type=int, default=40, help="windows 2..N (default 40)")
    parser.add_argument("--max-prompt", type=int, default=80, help="prompts 1..N tokens (default 80)")
    args = parser.parse_args(argv)
    pages = [1, 2, 4, 8, 16]
    windows, prompts = range(2, args.max_window + 1), range(1, args.max_prompt + 1)
    found = find_unprotected(pages, windows, prompts)
    cases = len(pages) * len(windows) * len(prompts)
    print(f"SGLang {load_sglang()['version']}: {sum(map(len, found.values()))} of {cases} cases unprotected")
    for (page, window), lengths in sorted(found.items()):
        print(f"  page {page}, window {window}: {len(lengths)} prompt lengths, e.g. {lengths[:6]}")


if __name__ == "__main__":
    main()
