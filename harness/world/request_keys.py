"""Requests whose block keys some vLLM release cannot tell apart: the ``request_keys`` workload feature.

A block's key must name everything its KV depends on.  vLLM releases before 0.31 keyed less
(``spec.releases.v0_31``): the LoRA adapter's name without its path, extra keys without a tag (an
adapter's name and an equal cache salt key the first block alike), and, in a block hashed after the
request was created (completed by output tokens), only the request's last multimodal item.  With
this feature the workload draws the inputs that tell those apart, at rates that meet each case
within seconds:

- a third adapter that shares a name with another (``SHARED_NAME_LORA``) and a salt equal to an
  adapter's name (``SALT_LIKE_LORA``);
- one or two one-token images in the prompt's unfinished block, which output tokens complete
  (``draw_tail_items``), for half of the requests;
- the next turn of a conversation: an earlier request's tokens so far (prompt and outputs) and its
  images, kept, with the earlier ones dropped, or one swapped (``next_turn``).

Nothing here knows which release runs: the spec's profile decides what each release shares, and
the KV ledger (docs/semantics.md §11) judges every block a request reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvspec.harness.core import ops as O
from kvspec.harness.world.choices import Choices

SHARED_NAME_LORA = ("sql", "/loras/sql-v2")  # the name of an adapter of ``workload.LORAS``, another path
SALT_LIKE_LORA = "sql"  # a cache salt equal to an adapter's name
PICTURES = ("pic-1", "pic-2", "pic-3")  # one-token multimodal items (the identifier fixes the length)
MAX_TURN_SOURCES = 8  # finished conversations kept for a next turn

Turn = tuple[tuple[int, ...], tuple[O.MMFeatureSpec, ...]]
"""A conversation so far: its tokens (prompt, then outputs) and its multimodal items."""


def draw_tail_items(ch: Choices, prompt_len: int, block_size: int) -> tuple[O.MMFeatureSpec, ...]:
    """One or two one-token images in the prompt's unfinished block (the one output tokens complete;
    its last full block when there is none), in offset order."""
    span = prompt_len % block_size or min(prompt_len, block_size)
    start = prompt_len - span
    if span >= 2 and ch.integer(0, 2, "one_image?") != 0:
        first = ch.integer(0, span - 2, "mm_first")
        offsets = [first, ch.integer(first + 1, span - 1, "mm_second")]
    else:
        offsets = [ch.integer(0, span - 1, "mm_only")]
    return tuple(O.MMFeatureSpec(ch.choice(PICTURES, "mm_picture"), start + o, 1) for o in offsets)


def next_turn(ch: Choices, sources: Sequence[Turn], limit: int) -> Turn:
    """A later turn of one of ``sources`` (half of the time one with images): its tokens (cut to
    ``limit``) and its images, of which the earlier ones may be dropped or one swapped for another
    picture."""
    with_images = [t for t in sources if t[1]]
    if with_images and ch.boolean("turn_with_images?"):
        sources = with_images
    tokens, items = ch.choice(sources, "turn_of")
    tokens = tokens[:limit]
    items = tuple(m for m in items if m.offset + m.length <= len(tokens))
    edit = ch.integer(0, 2, "turn_images") if items else 0
    if edit == 1:
        items = items[-1:]
    elif edit == 2:
        i = ch.integer(0, len(items) - 1, "swapped_image")
        other = ch.choice([p for p in PICTURES if p != items[i].identifier], "new_picture")
        items = (*items[:i], O.MMFeatureSpec(other, items[i].offset, items[i].length), *items[i + 1 :])
    return tokens, items
