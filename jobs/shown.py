"""Text a user chose (a job's name, command, cwd, reason), made safe to print on someone's terminal.

Names and commands come from any user of a shared queue, and a terminal obeys what it prints: an escape
sequence can retitle the window, rewrite lines already printed, hide text or (on old terminals) type into
the shell; CR and LF can forge whole rows of `gpuq status`. Every reader prints such text through
:func:`shown`, which writes control characters (C0, DEL, C1) and the bidirectional overrides as visible
escapes (``\\x1b``, ``\\r``, ``\\u202e``) and leaves everything else, Unicode included, as it is.
"""

from __future__ import annotations

_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def shown(text: str) -> str:
    """``text`` with every character that could steer a terminal written as an escape."""
    if text.isprintable():  # the common case, at C speed
        return text
    return text.translate(_ESCAPES)
