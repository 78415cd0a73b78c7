"""The sample listing: a CSV or JSONL file of ``path[,label][,split]`` and targets, untrusted.

:func:`read_rows` reads a listing line by line: strictly UTF-8 (a BOM is allowed), no NUL byte,
each physical line and CSV field bounded, every CSV row as wide as its header, every JSON line an
object. Columns other than ``path``, ``label`` and ``split`` come back as each row's
``extras`` (CSV: the field text; JSONL: the JSON value); :mod:`h5forge.discover.columns` makes
target columns of them. ``label`` may be absent when there are other columns. Every error
names the listing and the physical line (a quoted CSV field holding newlines does not shift the
count); names from the file are shown escaped
(:func:`h5forge.text.printable`). The rows' labels and paths are checked by
:mod:`h5forge.discover.rows`, and :mod:`h5forge.discover.catalog` turns them into a
:class:`~h5forge.discover.catalog.Catalog`.
"""

from __future__ import annotations

import csv
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from h5forge.documents import parse_json
from h5forge.files import file_kind, open_regular
from h5forge.location import MAX_LISTING_BYTES
from h5forge.text import printable

__all__ = [
    "check_listing_file",
    "JSONL_SUFFIXES",
    "LABEL_FLOOR",
    "MAX_LABEL_CHARS",
    "MAX_LINE_BYTES",
    "MAX_LISTING_ROWS",
    "MAX_PATH_BYTES",
    "ListingRow",
    "read_rows",
]

# Listing bounds. Each is far above a real listing (ImageNet-21k's 14 M rows are ~1 GB of
# CSV and would be split) and keeps a hostile one from costing more than its size justifies.
MAX_LISTING_ROWS = 10_000_000
MAX_LINE_BYTES = 2**20  # one physical line; a CSV field is also capped by csv.field_size_limit()
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_LABEL_CHARS = 1024
# Integer labels must be below max(rows, LABEL_FLOOR): see check_label_range.
LABEL_FLOOR = 1024
_INT = re.compile(r"[0-9]+")
#: Suffixes of a JSON Lines listing; any other is read as CSV.
JSONL_SUFFIXES = (".jsonl", ".ndjson")

# (line, path, label, split, extras): ``line`` is the physical line the record starts on;
# ``label`` is None when the listing gives none; ``extras`` maps every other column to its value.
ListingRow = tuple[int, str, str | int | None, str | None, dict[str, object]]


def read_rows(path: Path) -> list[ListingRow]:
    """Read and check every row of a CSV or JSONL listing (format by suffix).

    Args:
        path: the listing; ``.jsonl``/``.ndjson`` is JSON Lines, anything else CSV.

    Returns:
        One ``(line, path, label, split, extras)`` per sample, in file order; ``line`` is the
        physical line the record starts on, ``label`` an ``int`` when every label is a number
        (None without a label), ``extras`` the other columns' values.

    Raises:
        FileNotFoundError: the listing does not exist.
        ValueError: it is not a regular file, is over a bound, or a line is malformed; the
            message names the listing and the line.
    """
    check_listing_file(
        path,
        f"sample listing '{printable(path)}'",
        MAX_LISTING_BYTES,
        "split it or pack from an ImageFolder",
    )
    return list(_read_jsonl(path) if path.suffix.lower() in JSONL_SUFFIXES else _read_csv(path))


def check_listing_file(path: Path, shown: str, limit: int, fix: str) -> None:
    """Refuse a listing file (a sample listing, a COCO file) that is missing, not a regular file
    (a FIFO would block the read; never opened) or over ``limit`` bytes (by ``stat``, before
    reading).

    Raises:
        FileNotFoundError, ValueError: the message starts with ``shown``; ``fix`` ends the
            one for a file over the limit.
    """
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{shown} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{shown} is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > limit:
        raise ValueError(f"{shown} is {st.st_size:,} bytes, over the limit of {limit:,}; {fix}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each physical line, decoded strictly, bounded in length."""
    shown = printable(path)
    # Never blocks, even on a FIFO swapped in after check_listing_file looked.
    with os.fdopen(open_regular(path, "listing"), "rb") as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(
                    f"{shown}:{number}: line is longer than {MAX_LINE_BYTES:,} "
                    "bytes; is this really a listing?"
                )
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some spreadsheets write
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise ValueError(
                    f"{shown}:{number}: NUL byte at column {nul + 1}; a listing "
                    "is UTF-8 text (is it UTF-16, or binary?)"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{shown}:{number}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is "
                    "not UTF-8; save the listing as UTF-8"
                ) from None
            if number > MAX_LISTING_ROWS + 1:  # +1: the CSV header
                raise ValueError(
                    f"{shown}:{number}: more than {MAX_LISTING_ROWS:,} lines; split the listing"
                )
            yield number, text


def _read_csv(path: Path) -> Iterator[ListingRow]:
    shown = printable(path)
    # _lines yields every physical line, so the reader's line_num counts physical lines.
    reader = csv.reader(text for _, text in _lines(path))
    header: list[str] | None = None
    records: list[tuple[int, list[str]]] = []
    consumed = 0
    while True:
        start = consumed + 1  # the physical line this record starts on
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise ValueError(_csv_error(shown, reader.line_num, str(e))) from None
        consumed = reader.line_num
        if not fields:
            continue  # a blank line
        if header is None:
            header = fields
            missing = {"path", "label"} - set(header)
            if missing == {"label"} and set(header) - {"path", "split"}:
                missing = set()  # target columns without a class: every sample is unlabelled
            if missing:
                raise ValueError(
                    f"{shown}:{start}: header {[printable(h) for h in header]} "
                    f"lacks {sorted(missing)}; expected path,label[,split]"
                )
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise ValueError(f"{shown}:{start}: header names {dupes} more than once")
            continue
        if len(fields) != len(header):
            raise ValueError(
                f"{shown}:{start}: {len(fields)} fields, but the header has "
                f"{len(header)} ({','.join(printable(h) for h in header)}); quote "
                "fields that contain commas"
            )
        records.append((start, fields))
    if header is None:
        return
    at = {name: header.index(name) for name in ("path", "label", "split") if name in header}
    extra = [(i, name) for i, name in enumerate(header) if name not in at]
    labels = [fields[at["label"]] if "label" in at else None for _, fields in records]
    digits = all(label is not None and _INT.fullmatch(label) for label in labels)
    for (line, fields), label in zip(records, labels, strict=True):
        split = fields[at["split"]] if "split" in at else None
        extras: dict[str, object] = {name: fields[i] for i, name in extra}
        if label is None:
            yield line, fields[at["path"]], None, split, extras
            continue
        if not label:
            raise ValueError(f"{shown}:{line}: empty label")
        if len(label) > MAX_LABEL_CHARS:
            raise ValueError(
                f"{shown}:{line}: label is {len(label):,} characters, over the "
                f"limit of {MAX_LABEL_CHARS:,}"
            )
        yield line, fields[at["path"]], int(label) if digits else label, split, extras


def _csv_error(shown: str, line: int, message: str) -> str:
    if "field larger than field limit" in message:
        return (
            f"{shown}:{line}: a field is longer than {csv.field_size_limit():,} characters "
            "(the CSV parser's limit); no path or label is that long: is a quote left "
            "open on an earlier line?"
        )
    return f"{shown}:{line}: malformed CSV ({printable(message)})"


def _read_jsonl(path: Path) -> Iterator[ListingRow]:
    shown = printable(path)
    for line, text in _lines(path):
        if not text.strip():
            continue
        obj = parse_json(text, what=f"{shown}:{line}: row")
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
            raise ValueError(f"{shown}:{line}: expected an object with a string 'path'")
        label = obj.get("label")
        if label is not None and (
            isinstance(label, bool)
            or not isinstance(label, (int, str))
            or label == ""
            or (isinstance(label, int) and label < 0)
        ):
            raise ValueError(
                f"{shown}:{line}: label {printable(repr(label), limit=60)} must be "
                "a class name or an int >= 0"
            )
        if isinstance(label, str) and len(label) > MAX_LABEL_CHARS:
            raise ValueError(
                f"{shown}:{line}: label is {len(label):,} characters, over the "
                f"limit of {MAX_LABEL_CHARS:,}"
            )
        split = obj.get("split")
        if split is not None and not isinstance(split, str):
            raise ValueError(
                f"{shown}:{line}: split {printable(repr(split), limit=60)} must be a string"
            )
        extras = {k: v for k, v in obj.items() if k not in ("path", "label", "split")}
        yield line, obj["path"], label, split, extras
