"""JSON text for the plain values a client writes (requests, ``--json`` answers), without the json package.

``import json`` loads ``re``, and ``re`` loads ``enum``: together a large part of a quick ``gpuq submit``,
which must stay close to Python's own start (bench/cli_cost.py measures it). A request holds only
dicts with string keys, lists, tuples, strings, ints, floats, booleans and None, which take a few lines to
write. What is written reads back with ``json.loads`` to the same values (tests/unit/test_jsontext.py checks it
against the json package over random values); the daemon and every reader still parse with ``json``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from typing import Any

# The characters JSON requires escaped inside a string: the quote, the backslash and the control characters.
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", **{c: f"\\u{c:04x}" for c in range(0x20)}}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b", ord("\f"): "\\f"})
_INF = float("inf")
_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def dumps(value: Any) -> str:
    """``json.dumps(value)`` for plain values: the same text but for the escapes in strings, the same values
    when read back. Lone surrogates (``os.environ`` decodes undecodable bytes to them) stay in the text,
    which ``encode`` then writes as ``\\udcxx`` escapes."""
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def encode(value: Any) -> bytes:
    """``dumps`` as UTF-8, with lone surrogates written as JSON escapes (which read back as the same str)."""
    return dumps(value).encode("utf-8", "backslashreplace")


def _write(value: Any, parts: list[str]) -> None:
    if isinstance(value, str):
        parts.append(f'"{value.translate(_ESCAPES)}"')
    elif value is None or value is True or value is False:
        parts.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        parts.append(int.__repr__(value))  # a bool was taken above; an IntEnum would repr as its name
    elif isinstance(value, float):
        # As json.dumps writes them (and json.loads reads them): NaN and the infinities are not JSON proper.
        parts.append(float.__repr__(value) if value == value and abs(value) != _INF else _SPECIAL[str(value)])
    elif isinstance(value, dict):
        parts.append("{")
        for at, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"JSON keys are strings, not {type(key).__name__}")
            parts.append(f'{", " if at else ""}"{key.translate(_ESCAPES)}": ')
            _write(item, parts)
        parts.append("}")
    elif isinstance(value, (list, tuple)):
        parts.append("[")
        for at, item in enumerate(value):
            if at:
                parts.append(", ")
            _write(item, parts)
        parts.append("]")
    else:
        raise TypeError(f"{type(value).__name__} has no JSON form here")
