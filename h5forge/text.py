"""Safe display of untrusted names: archive members, class names, sample listing paths.

A name that came from someone else's archive, sample listing or folder can hold terminal control
sequences (``ESC [ 2 J`` clears the screen, ``ESC ] 52`` writes the clipboard), carriage
returns that overwrite the line they are printed on, bidi overrides that show ``exe.txt`` for
``txt.exe``, or bytes that are not UTF-8 at all. Every error message and log line h5forge
writes passes such a name through :func:`printable` first, so what reaches a terminal or a log
is exactly the characters that were there, made visible.

The rule is Python's own: a character is shown as it is when ``str.isprintable`` says so (the
space included), and escaped the way ``repr`` escapes it otherwise. That covers C0 controls, DEL,
C1 controls (``U+0080``-``U+009F``, which some terminals treat as ``ESC`` sequences), format
characters (bidi overrides and isolates, zero-width characters, the BOM), line and paragraph
separators, and lone surrogates (``os.fsdecode`` turns each non-UTF-8 byte into one). Unlike
``repr`` it adds no quotes and keeps printable non-ASCII characters (``café``, ``猫``) readable.
A backslash is doubled so an escape in the output cannot be forged by the name itself.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_LIMIT", "printable"]

# Longest name shown whole. A listing field can be 128 KB: a message quoting it whole would
# bury the line that says what is wrong. Head and tail are kept, because both ends of a path
# carry information (its folder, its file name).
DEFAULT_LIMIT = 512

_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(name: object, *, limit: int | None = DEFAULT_LIMIT) -> str:
    """Return ``name`` with every character that is not safe to print escaped.

    Args:
        name: a ``str``, ``bytes`` (decoded as UTF-8, each invalid byte shown as ``\\xNN``),
            an ``os.PathLike``, or anything else (its ``str()``).
        limit: longest result, in characters of the original name, shown whole; a longer one
            keeps its head and tail around a marker saying how much was left out. ``None``
            shows everything.

    Returns:
        A single line of printable text, with no quotes added.

    Example:
        >>> printable("cat\\x1b[2Jdog\\n")
        'cat\\\\x1b[2Jdog\\\\n'
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, bytes):
        # surrogateescape keeps every invalid byte as one lone surrogate U+DC80..U+DCFF,
        # which is then shown as the byte it stood for.
        text = name.decode("utf-8", "surrogateescape")
    elif isinstance(name, str):
        text = name
    else:
        text = str(name)
    omitted = ""
    if limit is not None and limit >= 0 and len(text) > limit:
        head = text[: (limit + 1) // 2]
        tail = text[len(text) - limit // 2 :] if limit // 2 else ""
        omitted = f"...[{len(text) - len(head) - len(tail)} characters omitted]..."
        return _render(head) + omitted + _render(tail)
    return _render(text)


def _render(text: str) -> str:
    if text.isprintable() and "\\" not in text:
        return text  # the common case costs one C-level scan
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")  # a non-UTF-8 byte kept by surrogateescape
        else:
            out.append(_escape(ch))
    return "".join(out)
