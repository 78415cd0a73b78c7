"""Documents read from outside: one parser, one error type, one nesting bound.

Every JSON document h5forge reads that it did not just write itself (a pointer, a sidecar, an
asset list, a file's ``config_json`` attribute, a cache record, a lock record, a listing row) is
untrusted input. Its bytes are bounded by the reader (``h5forge.location.MAX_*_BYTES``); its
structure is bounded here, before parsing, by :data:`MAX_JSON_DEPTH`; and whatever is wrong
with it is a :class:`DocumentError` naming the document (docs/FORMAT.md, "untrusted input").
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

__all__ = ["MAX_JSON_DEPTH", "DocumentError", "parse_json"]

#: Nesting of any JSON document read (h5forge's own are at most 4 deep): deeper is refused
#: before parsing, so a hostile document cannot exhaust the parser's recursion, nor that of
#: code walking the result.
MAX_JSON_DEPTH = 32

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_STEPS_AT_ONCE = 1 << 24


class DocumentError(ValueError):
    """A document read from outside is not one h5forge wrote: too large, too deeply nested,
    not JSON, or not a regular file. The message names the document and the fix."""


def parse_json(raw: bytes | str, *, what: str, name: str = "") -> Any:
    """``raw`` parsed as JSON from outside: the one parser of every untrusted document.

    Nesting deeper than :data:`MAX_JSON_DEPTH` is refused before parsing (a hostile document
    cannot exhaust the parser's recursion, nor that of code walking the result); every failure
    is a :class:`DocumentError` naming the document. Bound the bytes before calling.

    Args:
        raw: the document's bytes or text.
        what: the kind of document, for messages ("pointer", "config_json attribute").
        name: which one (a redacted URL, a file name), quoted after ``what`` in messages;
            empty when ``what`` says it (``"m.jsonl:3: row"``).

    Raises:
        DocumentError: nested too deep, or not JSON.
    """
    shown = f"{what} {name!r}" if name else what
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _nesting(data) > MAX_JSON_DEPTH:
        raise DocumentError(
            f"{shown} is not JSON h5forge reads: it nests more than {MAX_JSON_DEPTH} "
            "levels deep; remove it or write it again"
        )
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        raise DocumentError(
            f"{shown} is not JSON ({type(e).__name__}: {str(e)[:120]}): it "
            "is not valid JSON; remove it or write it again"
        ) from None


def _nesting(raw: bytes) -> int:
    """How deep ``raw``'s arrays and objects nest (brackets inside strings do not count).

    Escapes and then strings are cut out and the brackets left summed as +1/-1 steps, in C
    (``re``, ``bytes.translate``, numpy): about a third of ``json.loads``'s own time on a
    large COCO file, instead of a Python loop per bracket.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot nest deeper than the bound: skip the scan
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    deepest = depth = 0
    for at in range(0, len(brackets), _STEPS_AT_ONCE):
        codes = np.frombuffer(brackets[at : at + _STEPS_AT_ONCE], np.uint8)
        running = np.cumsum(_STEP[codes], dtype=np.int64) + depth
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest
