"""The tiny random-weight models the engine checks run: one per KV-cache layout kvspec models.

``full``: a Llama (every layer full attention, one KV group); ``sliding``: a Mistral with a 64-token
window on every layer (one sliding-window group); ``hybrid``: a Gemma 2 (sliding and full layers
alternating: two groups sharing one pool).  Each is written with transformers' ``save_pretrained``
from a fixed seed into a folder of its own, once (a stamp names the recipe), float32.  Head size 32:
the CPU attention backend's smallest supported one; blocks of 32 tokens, the CPU backend's rule.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

MODEL_KINDS = ("full", "sliding", "hybrid")
ARCHITECTURE = {"full": "llama", "sliding": "mistral", "hybrid": "gemma2"}
VOCAB = 256
SLIDING_WINDOW = 64
BLOCK_SIZE = 32  # tokens per block: the CPU attention backend wants a multiple of 32
MAX_MODEL_LEN = 256
WEIGHT_SEED = 0
TINY: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
)
RECIPE = 1  # bump when the models change: folders with another stamp are rewritten


def model_config(kind: str) -> Any:
    """The transformers config of model ``kind``."""
    import transformers as _transformers

    transformers: Any = _transformers

    if kind == "full":
        return transformers.LlamaConfig(**TINY)
    if kind == "sliding":
        return transformers.MistralConfig(sliding_window=SLIDING_WINDOW, **TINY)
    if kind == "hybrid":
        return transformers.Gemma2Config(sliding_window=SLIDING_WINDOW, **TINY)
    raise ValueError(f"unknown model kind {kind!r} (known: {', '.join(MODEL_KINDS)})")


def stamp(kind: str) -> str:
    return json.dumps({"kind": kind, "recipe": RECIPE, "seed": WEIGHT_SEED, **TINY, "window": SLIDING_WINDOW})


def write_model(kind: str, root: Path) -> Path:
    """The folder of model ``kind`` under ``root``, written first if missing or of another recipe
    (into a temporary folder, then renamed: a killed write leaves nothing half made)."""
    import torch
    import transformers as _transformers

    transformers: Any = _transformers
    folder = root / kind
    if (folder / "kvspec-model.json").is_file() and (folder / "kvspec-model.json").read_text() == stamp(kind):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{kind}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(WEIGHT_SEED)
    model = transformers.AutoModelForCausalLM.from_config(model_config(kind), dtype=torch.float32)
    model.save_pretrained(tmp)
    (tmp / "kvspec-model.json").write_text(stamp(kind))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder
