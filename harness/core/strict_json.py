"""JSON read strictly: every value of one exact type within its bounds, every error naming its JSON path.

Traces (``harness.traces.trace``, ``harness.traces.schema``) and operations (``harness.core.ops_json``)
are read with these: an int is never a bool or a float, a list never a string; nothing is coerced.
The bounds below are the trace schema's (its whole text is in ``harness/traces/trace.py``'s docstring).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


class TraceFormatError(ValueError):
    """A trace or operation that cannot be read; the message names the offending part."""


# --- bounds of the trace schema ---------------------------------------------------------------

MAX_TOKENS = 1 << 20  # a token count or position, a token list's length, max_model_len, a window, a chunk
MAX_NUM_BLOCKS = 1 << 20  # num_blocks (SpecTarget.reset at this bound: 0.1 to 0.2 s); block ids are below it
MAX_BLOCK_SIZE = 1 << 16
MAX_TOKEN_ID = (1 << 31) - 1
MAX_NAME_CHARS = 256  # request ids, multimodal identifiers, names, kinds
MAX_TEXT_CHARS = 4096  # LoRA names and paths, cache salts
MAX_MM_FEATURES = 1024  # multimodal items of one request
MAX_EMBED_ROW_CHARS = 1 << 18  # one prompt_embeds row in hex: up to 32768 float32 elements


def describe(value: Any) -> str:
    """``value`` as an error message shows it: strings as Python literals, other values in their JSON
    spelling (``true``, ``null``, ``2.5``), containers by size; cut short."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if isinstance(value, dict):
        return f"an object of {len(value)} field(s)"
    if isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    if type(value) is int and value.bit_length() > 128:
        return f"an int of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def describe_names(names: Iterable[str]) -> str:
    """A few field names, sorted, for an 'unknown field(s)' message."""
    shown = sorted(names)
    return ", ".join(describe(n) for n in shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def key_path(where: str, key: str) -> str:
    """The JSON path of field ``key`` of the object at ``where`` (``a.b``, or ``a["3"]`` for other keys)."""
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{json.dumps(key)}]"


def want_int(value: Any, where: str, lo: int, hi: int) -> int:
    """``value`` if it is a JSON int (not a bool, not a float) in ``[lo, hi]``."""
    if type(value) is not int or not lo <= value <= hi:
        raise TraceFormatError(f"{where}: expected an int >= {lo} and <= {hi}, got {describe(value)}")
    return value


def want_bool(value: Any, where: str) -> bool:
    """``value`` if it is ``true`` or ``false`` (not 0 or 1)."""
    if type(value) is not bool:
        raise TraceFormatError(f"{where}: expected true or false, got {describe(value)}")
    return value


def want_str(value: Any, where: str, max_chars: int, min_chars: int = 0) -> str:
    """``value`` if it is a string of ``min_chars`` to ``max_chars`` characters of valid Unicode."""
    if type(value) is not str or not min_chars <= len(value) <= max_chars:
        what = "a non-empty string" if min_chars else "a string"
        raise TraceFormatError(f"{where}: expected {what} of at most {max_chars} characters, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceFormatError(f"{where}: not valid Unicode text (a lone surrogate): {describe(value)}") from None
    return value


def want_choice(value: Any, where: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of the strings ``choices``."""
    known = tuple(choices)
    if type(value) is not str or value not in known:
        raise TraceFormatError(f"{where}: expected one of {', '.join(map(repr, known))}, got {describe(value)}")
    return value


def want_list(value: Any, where: str, max_len: int) -> list[Any]:
    """``value`` if it is a JSON list of at most ``max_len`` items."""
    if type(value) is not list or len(value) > max_len:
        raise TraceFormatError(f"{where}: expected a list of at most {max_len} items, got {describe(value)}")
    return value


def want_int_list(value: Any, where: str, lo: int, hi: int, max_len: int) -> tuple[int, ...]:
    """``value`` as a tuple if it is a list of at most ``max_len`` ints, each in ``[lo, hi]``."""
    items = want_list(value, where, max_len)
    if not all(type(t) is int and lo <= t <= hi for t in items):
        for i, t in enumerate(items):
            want_int(t, f"{where}[{i}]", lo, hi)
    return tuple(items)


def want_object(
    value: Any, where: str, required: Iterable[str] = (), optional: Iterable[str] | None = ()
) -> dict[str, Any]:
    """``value`` if it is a JSON object with every ``required`` field and, unless ``optional`` is
    None (any other field allowed), no field outside ``required`` and ``optional``."""
    if type(value) is not dict:
        raise TraceFormatError(f"{where}: expected an object, got {describe(value)}")
    required = tuple(required)
    for name in required:
        if name not in value:
            raise TraceFormatError(f"{where}: missing field {name!r}")
    if optional is not None:
        unknown = set(value) - set(required) - set(optional)
        if unknown:
            raise TraceFormatError(f"{where}: unknown field(s) {describe_names(unknown)}")
    return value
