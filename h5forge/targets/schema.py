"""The target schema: which columns a sample carries, of which kind, and the raw values' rules.

A :class:`Column` is a name and a kind. Raw values (what a source gives, one per column and
sample, in :attr:`h5forge.discover.catalog.Sample.targets`) are checked by :func:`check_value`,
which returns the normalised value or raises :class:`TargetError` with a reason that starts
with ``bad target:`` (a source quarantines the sample with it):

=============  ==============================================================================
kind           raw value
=============  ==============================================================================
``multilabel`` a sorted tuple of distinct indices into ``Column.classes``
``boxes``      a tuple of ``(x1, y1, x2, y2, class index, iscrowd)``: finite floats, ``x1 <= x2``,
               ``y1 <= y2``, in the pixel grid of the source file (before EXIF orientation),
               class an index into ``Column.classes``, iscrowd 0 or 1
``mask``       the absolute local path of a mask image (pixel values are class ids 0..255), or
               a :class:`~h5forge.targets.shapes.Drawn` (shapes to draw: COCO segmentations)
``text``       a ``str`` of at most :data:`MAX_TEXT_BYTES` UTF-8 bytes, without NUL
``number``     an ``int`` (``dtype="int64"``) or a finite ``float`` (``dtype="float64"``)
=============  ==============================================================================

Every bound is named here, so sources, the writer and the readers agree: at most
:data:`MAX_COLUMNS` columns, :data:`MAX_CLASSES` classes per column, :data:`MAX_BOXES` boxes per
sample. Light to import: no numpy.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from h5forge.documents import parse_json
from h5forge.targets.shapes import Drawn

__all__ = [
    "KINDS",
    "MAX_BOXES",
    "MAX_CLASSES",
    "MAX_COLUMNS",
    "MAX_TEXT_BYTES",
    "RESERVED",
    "Column",
    "Kind",
    "Schema",
    "TargetError",
    "check_value",
    "parse_columns",
    "parse_schema",
    "schema_json",
]

Kind = Literal["multilabel", "boxes", "mask", "text", "number"]
KINDS: tuple[str, ...] = get_args(Kind)
NumberType = Literal["int64", "float64"]

MAX_COLUMNS = 16
MAX_CLASSES = 65_536
MAX_BOXES = 10_000
MAX_TEXT_BYTES = 64 * 1024
#: Names a column may not take: the reader's own ``target=`` words and the sample listing's columns.
RESERVED = frozenset({"class", "label", "labels", "path", "split", "image", "index"})
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class TargetError(ValueError):
    """A raw target value breaks its column's rule; the message is a quarantine reason."""


@dataclass(frozen=True)
class Column:
    """One target column.

    Attributes:
        name: lower-case identifier, 1..64 characters (``[a-z][a-z0-9_]*``), not in
            :data:`RESERVED`.
        kind: one of :data:`KINDS`.
        classes: ``multilabel`` and ``boxes``: the class names, sorted; indices refer to them.
        dtype: ``number`` only: ``"int64"`` or ``"float64"``.
        encoding: ``mask`` only, set by the pack: ``"raw"`` (uint8 pixels, decoded layout) or
            ``"png"`` (encoded layout); ``""`` before packing.
    """

    name: str
    kind: Kind
    classes: tuple[str, ...] = field(default=())
    dtype: NumberType | None = None
    encoding: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.classes, list):
            object.__setattr__(self, "classes", tuple(self.classes))
        where = f"target column {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"{where}: a column name is 1..64 characters of a-z, 0-9 and '_', starting "
                "with a letter"
            )
        if self.name in RESERVED:
            raise ValueError(f"{where}: the name is reserved ({sorted(RESERVED)}); rename it")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind {self.kind!r} is not one of {KINDS}")
        has_classes = self.kind in ("multilabel", "boxes")
        if self.classes and not has_classes:
            raise ValueError(f"{where}: only multilabel and boxes columns have classes")
        if len(self.classes) > MAX_CLASSES:
            raise ValueError(f"{where}: {len(self.classes):,} classes, more than {MAX_CLASSES:,}")
        if any(not isinstance(c, str) for c in self.classes) or list(self.classes) != sorted(
            set(self.classes)
        ):
            raise ValueError(f"{where}: classes must be distinct strings, sorted")
        if (self.kind == "number") != (self.dtype is not None):
            raise ValueError(f"{where}: a number column needs dtype 'int64' or 'float64'")
        if self.dtype is not None and self.dtype not in get_args(NumberType):
            raise ValueError(f"{where}: dtype {self.dtype!r} is not 'int64' or 'float64'")
        if self.encoding not in (("", "raw", "png") if self.kind == "mask" else ("",)):
            raise ValueError(f"{where}: encoding {self.encoding!r} is not allowed here")

    def to_dict(self) -> dict[str, Any]:
        """The column as the file's ``targets_json`` records it."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind in ("multilabel", "boxes"):
            out["classes"] = list(self.classes)
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.kind == "mask":
            out["encoding"] = self.encoding
        return out


Schema = tuple[Column, ...]


def schema_json(schema: Sequence[Column]) -> str:
    """Canonical JSON of a schema (a list of column objects, in column order)."""
    check_schema(schema)
    return json.dumps([c.to_dict() for c in schema], sort_keys=True, separators=(",", ":"))


def check_schema(schema: Sequence[Column]) -> None:
    """Refuse more than :data:`MAX_COLUMNS` columns or two with one name."""
    if len(schema) > MAX_COLUMNS:
        raise ValueError(f"{len(schema)} target columns, more than {MAX_COLUMNS}")
    names = [c.name for c in schema]
    if len(set(names)) != len(names):
        raise ValueError(f"target column names repeat: {names}")


def parse_schema(text: str, *, where: str) -> Schema:
    """Parse ``targets_json`` (from a file someone else wrote: bounded and checked).

    Raises:
        ValueError: not a JSON list of valid columns; the message starts with ``where``.
    """
    if len(text) > (MAX_COLUMNS + 1) * (MAX_CLASSES * 64 + 256):
        raise ValueError(f"{where}: targets_json is {len(text):,} characters, too long")
    try:
        raw = parse_json(text, what="targets_json attribute", name=where)
        if not isinstance(raw, list):
            raise ValueError("not a list")
        schema = tuple(
            Column(
                name=c["name"],
                kind=c["kind"],
                classes=tuple(c.get("classes", ())),
                dtype=c.get("dtype"),
                encoding=c.get("encoding", ""),
            )
            for c in raw
        )
        check_schema(schema)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{where}: targets_json is not a valid target schema: {e}") from None
    return schema


def parse_columns(text: str) -> dict[str, Kind]:
    """Parse the ``--columns`` grammar: ``NAME=KIND[,NAME=KIND...]`` (a sample listing's target
    columns), or ``none`` (no target column: every column but path, label and split ignored).

    Raises:
        ValueError: not that grammar, an invalid name, an unknown kind or a repeated name.
    """
    if text.strip().lower() == "none":
        return {}
    out: dict[str, Kind] = {}
    for part in text.split(","):
        name, eq, kind = (x.strip() for x in part.partition("="))
        if not eq or not name or not kind:
            raise ValueError(
                f"columns {text!r} is not NAME=KIND[,NAME=KIND...] (e.g. tags=multilabel,"
                f"caption=text) or none; kinds: {', '.join(KINDS)}"
            )
        if kind not in KINDS:
            raise ValueError(f"columns: kind {kind!r} of {name!r} is not one of {KINDS}")
        if name in out:
            raise ValueError(f"columns: {name!r} is given twice")
        out[name] = cast(Kind, kind)
        Column(name, out[name], dtype="float64" if kind == "number" else None)  # name rules
    if len(out) > MAX_COLUMNS:
        raise ValueError(f"columns: {len(out)} columns, more than {MAX_COLUMNS}")
    return out


def check_value(column: Column, value: object) -> object:
    """Return ``value`` normalised for ``column`` (see the module's table).

    Raises:
        TargetError: the value breaks the rule; the message starts with ``bad target:`` and
            names the column, the value (shortened) and the rule.
    """
    where = f"bad target: column {column.name!r}"
    kind = column.kind
    if kind == "multilabel":
        if not isinstance(value, (list, tuple)) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        ):
            raise TargetError(f"{where}: expected a list of class indices, got {_short(value)}")
        bad = [v for v in value if not 0 <= v < len(column.classes)]
        if bad:
            raise TargetError(
                f"{where}: class index {bad[0]} is outside 0..{len(column.classes) - 1}"
            )
        return tuple(sorted(set(value)))
    if kind == "boxes":
        return _check_boxes(column, value, where)
    if kind == "mask":
        if isinstance(value, Drawn):  # shapes to draw (COCO segmentations)
            problem = value.problem()
            if problem is not None:
                raise TargetError(f"{where}: {problem}")
            return value
        if not isinstance(value, str) or not value:
            raise TargetError(f"{where}: expected the path of a mask image, got {_short(value)}")
        return value
    if kind == "text":
        if not isinstance(value, str):
            raise TargetError(f"{where}: expected a string, got {_short(value)}")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_TEXT_BYTES:
            raise TargetError(
                f"{where}: text of {size:,} bytes, more than the limit of {MAX_TEXT_BYTES:,}"
            )
        if "\x00" in value:
            raise TargetError(f"{where}: text holds a NUL character")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TargetError(f"{where}: expected a number, got {_short(value)}")
    if column.dtype == "int64":
        if not isinstance(value, int) and not (math.isfinite(value) and value == int(value)):
            raise TargetError(f"{where}: expected an integer, got {_short(value)}")
        if not -(2**63) <= int(value) < 2**63:
            raise TargetError(f"{where}: {_short(value)} does not fit in int64")
        return int(value)
    if not math.isfinite(float(value)):
        raise TargetError(f"{where}: {value!r} is not a finite number")
    return float(value)


def _check_boxes(column: Column, value: object, where: str) -> tuple[tuple[float, ...], ...]:
    if not isinstance(value, (list, tuple)):
        raise TargetError(f"{where}: expected a list of boxes, got {_short(value)}")
    if len(value) > MAX_BOXES:
        raise TargetError(f"{where}: {len(value):,} boxes, more than {MAX_BOXES:,}")
    out = []
    for j, box in enumerate(value):
        if not isinstance(box, (list, tuple)) or len(box) != 6:
            raise TargetError(
                f"{where}: box {j} is {_short(box)}, expected (x1, y1, x2, y2, class, iscrowd)"
            )
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in box):
            raise TargetError(f"{where}: box {j} holds a value that is not a number")
        try:
            x1, y1, x2, y2, cls, crowd = (float(v) for v in box)
        except OverflowError:  # an integer of hundreds of digits
            raise TargetError(f"{where}: box {j} holds a number too large for a float") from None
        if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
            raise TargetError(f"{where}: box {j} has a coordinate that is not finite (NaN/inf)")
        if x2 < x1 or y2 < y1:
            raise TargetError(
                f"{where}: box {j} ({x1:g}, {y1:g}, {x2:g}, {y2:g}) has a negative size; "
                "boxes are XYXY with x1 <= x2 and y1 <= y2"
            )
        if cls != int(cls) or not 0 <= cls < len(column.classes):
            raise TargetError(
                f"{where}: box {j} class {cls:g} is outside 0..{len(column.classes) - 1}"
            )
        if crowd not in (0.0, 1.0):
            raise TargetError(f"{where}: box {j} iscrowd is {crowd:g}, expected 0 or 1")
        out.append((x1, y1, x2, y2, float(int(cls)), crowd))
    return tuple(out)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
