"""A listing's target columns: the schema, given or inferred, and each row's raw values.

Every listing column other than ``path``, ``label`` and ``split`` is a target column
(:mod:`h5forge.targets.schema`). ``columns=`` gives the schema: ``{name: kind}`` or
``{name: Column}`` (a ``Column`` fixes the classes or the dtype); columns of the listing it does
not name are ignored (``columns={}`` ignores them all, as before targets existed), and a name it
gives that the listing lacks is an error. Without ``columns=`` every other column is inferred:

- a name ``mask`` or ending in ``_mask``: ``mask`` (a path, checked like an image path);
- a name ``boxes`` or ending in ``_boxes``: ``boxes``;
- JSONL: strings -> ``text``; integers -> ``number`` int64; numbers with a fraction -> float64;
  lists of strings -> ``multilabel``; lists of lists -> ``boxes``; a key missing or ``null`` on
  a line says nothing (the row is then quarantined: no value); two kinds in one column, or a
  bool or object, is a ``ValueError``;
- CSV: every non-empty field an integer -> int64, a number -> float64, else ``text``.
  ``multilabel`` needs ``columns=`` (names separated by ``|``, an empty field is no label).

Values: multilabel JSONL a list of class names; boxes a list of ``[x1, y1, x2, y2, "class"]`` or
``[x1, y1, x2, y2, "class", iscrowd]`` (XYXY, source-file pixels; in CSV the same list as JSON
text). A column's classes are the sorted set of names seen. A value that breaks its column's
rule (:func:`h5forge.targets.schema.check_value`, a mask path that is missing or leaves the
folder, a box of a class the given ``Column`` lacks) raises :class:`TargetError`: the row is
quarantined, the listing is not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from h5forge.discover.listing import MAX_LABEL_CHARS
from h5forge.discover.rows import check_file, check_path
from h5forge.documents import DocumentError, parse_json
from h5forge.targets.schema import (
    KINDS,
    MAX_COLUMNS,
    Column,
    Kind,
    Schema,
    TargetError,
    check_schema,
    check_value,
)

__all__ = ["ColumnSpec", "RowTargets", "listing_schema"]

#: What ``discover(..., columns=)`` takes: a kind per column name, or a whole ``Column``.
ColumnSpec = Mapping[str, "Kind | Column"]

_INT = re.compile(r"[+-]?[0-9]{1,18}")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?|[+-]?(nan|inf)", re.I)


def listing_schema(
    shown: str,
    extras: list[tuple[int, dict[str, object]]],
    columns: ColumnSpec | None,
    *,
    csv: bool,
) -> Schema:
    """The target columns of a listing (``shown``, its printable name) from the extra columns
    of each row (``(line, extras)``): ``columns`` checked, or inferred; ``csv``: values are CSV
    text, else JSON values.

    Raises:
        ValueError: a name that is not a valid column name, more than ``MAX_COLUMNS`` columns,
            a given name the listing lacks, or a column whose values mix kinds.
    """
    seen: dict[str, None] = {}
    for _, row in extras:
        for name in row:
            seen[name] = None
        if len(seen) > MAX_COLUMNS and columns is None:
            raise ValueError(
                f"{shown}: more than {MAX_COLUMNS} columns besides path, label and split "
                f"({', '.join(list(seen)[:20])}, ...); pass columns= naming the ones to keep"
            )
    if columns is not None:
        absent = [name for name in columns if name not in seen]
        if absent:
            raise ValueError(
                f"{shown}: columns= names {absent}, which the listing does not have (its "
                f"columns: {list(seen)[:20]}); fix the name or drop it from columns="
            )
    specs: Mapping[str, Kind | Column | None] = (
        columns if columns is not None else dict.fromkeys(seen)
    )
    schema = []
    for name, spec in specs.items():
        values = [(line, row.get(name)) for line, row in extras]
        try:
            schema.append(_column(shown, name, spec, values, csv))
        except ValueError as e:
            if str(e).startswith(shown):
                raise
            raise ValueError(
                f"{shown}: {e}; rename the column, or pass columns= naming the ones to keep "
                "(columns={} ignores them all)"
            ) from None
    try:
        check_schema(schema)
    except ValueError as e:
        raise ValueError(f"{shown}: {e}") from None
    return tuple(schema)


class RowTargets:
    """Checks each row's target values against a schema (class indexes built once).

    Args:
        schema: the columns, from :func:`listing_schema`.
        csv: whether field values are CSV text.
        folder: the listing's folder; mask paths are relative to it.
        folder_real: its real path.
        folders: the real-path cache :func:`~h5forge.discover.rows.check_file` shares.
    """

    def __init__(
        self, schema: Schema, *, csv: bool, folder: Path, folder_real: str, folders: dict[str, str]
    ) -> None:
        self.schema, self.csv, self.folder = schema, csv, folder
        self.folder_real, self.folders = folder_real, folders
        self.index = {c.name: {n: i for i, n in enumerate(c.classes)} for c in schema}

    def __call__(self, where: str, row: dict[str, object]) -> tuple[object, ...]:
        """One row's checked raw values, one per column.

        Raises:
            TargetError: a value breaks its column's rule; the reason names the column and
                ends with ``(where)`` (``FILE:LINE``).
        """
        out = []
        for column in self.schema:
            try:
                out.append(check_value(column, self._convert(column, row.get(column.name))))
            except (TargetError, FileNotFoundError, ValueError) as e:
                reason = str(e) if str(e).startswith("bad target:") else f"bad target: {e}"
                raise TargetError(f"{reason} ({where})") from None
        return tuple(out)

    def _convert(self, column: Column, v: object) -> object:
        """A raw field as the value ``check_value`` takes for ``column``."""
        where = f"bad target: column {column.name!r}"
        if v is None:
            raise TargetError(f"{where}: no value on this row")
        if column.kind == "number" and self.csv:
            number = _number(v)
            if number is None:
                raise TargetError(f"{where}: {str(v)[:60]!r} is not a number")
            return number
        if column.kind == "mask":
            if not isinstance(v, str):
                raise TargetError(f"{where}: expected a mask path, got {repr(v)[:60]}")
            norm = check_path(where, v)
            full = self.folder / norm
            check_file(where, v, norm, full, self.folder_real, self.folders)
            return str(full)
        if column.kind not in ("multilabel", "boxes"):
            return v
        items = _parse_list(v, self.csv, sep=column.kind == "multilabel")
        if items is None:
            raise TargetError(f"{where}: expected a list, got {str(v)[:60]!r}")
        index = self.index[column.name]
        if column.kind == "multilabel":
            bad = [x for x in items if not isinstance(x, str) or x not in index]
            if bad:
                raise TargetError(f"{where}: class {_name_problem(bad[0])}")
            return [index[x] for x in items]  # type: ignore[index]
        boxes = []
        for j, box in enumerate(items):
            if not isinstance(box, list) or len(box) not in (5, 6):
                raise TargetError(
                    f'{where}: box {j} is {repr(box)[:60]}, expected [x1, y1, x2, y2, "class"] '
                    'or [x1, y1, x2, y2, "class", iscrowd]'
                )
            if not isinstance(box[4], str) or box[4] not in index:
                raise TargetError(f"{where}: box {j} class {_name_problem(box[4])}")
            boxes.append((*box[:4], index[box[4]], box[5] if len(box) == 6 else 0))
        return boxes


def _name_problem(name: object) -> str:
    if not isinstance(name, str):
        return f"{repr(name)[:60]} is not a class name (a string)"
    if not 0 < len(name) <= MAX_LABEL_CHARS:
        return f"name of {len(name):,} characters, outside 1..{MAX_LABEL_CHARS:,}"
    return f"{name[:60]!r} is not one of the column's classes"


def _is_name(x: object) -> bool:
    return isinstance(x, str) and 0 < len(x) <= MAX_LABEL_CHARS


def _column(
    shown: str, name: str, spec: Kind | Column | None, values: list[tuple[int, object]], csv: bool
) -> Column:
    if isinstance(spec, Column):
        if spec.name != name:
            raise ValueError(f"columns= maps {name!r} to a Column named {spec.name!r}")
        return spec
    kind = spec if spec is not None else _infer(shown, name, values, csv)
    if kind not in KINDS:
        raise ValueError(f"target column {name!r}: kind {kind!r} is not one of {KINDS}")
    if kind == "number":
        numbers = [_number(v) if csv else v for _, v in values]
        whole = all(isinstance(v, int) for v in numbers if isinstance(v, (int, float)))
        return Column(name, "number", dtype="int64" if whole else "float64")
    if kind in ("multilabel", "boxes"):
        names: set[str] = set()
        for _, v in values:
            names.update(_class_names(kind, v, csv))
        return Column(name, kind, classes=tuple(sorted(names)))
    return Column(name, kind)


def _infer(shown: str, name: str, values: list[tuple[int, object]], csv: bool) -> Kind:
    if name == "mask" or name.endswith("_mask"):
        return "mask"
    if name == "boxes" or name.endswith("_boxes"):
        return "boxes"
    if csv:
        filled = [v for _, v in values if v != ""]
        return "number" if filled and all(_number(v) is not None for v in filled) else "text"
    kinds: dict[str, tuple[int, object]] = {}
    for line, v in values:
        kind = _json_kind(v)
        if kind is not None:
            kinds.setdefault(kind, (line, v))
    if "empty" in kinds and len(kinds) > 1:
        del kinds["empty"]  # [] is a multilabel or a boxes value
    found = set(kinds)
    if found <= {"int", "float"} and found:
        return "number"
    if len(found) == 1 and found <= {"text", "multilabel", "boxes", "empty"}:
        only = found.pop()
        return "multilabel" if only == "empty" else only  # type: ignore[return-value]
    if not kinds:
        raise ValueError(f"{shown}: column {name!r} is null on every line; drop it or use columns=")
    by_line = sorted(kinds.items(), key=lambda kv: kv[1][0])
    first_kind, (first_line, _) = by_line[0]
    bad_kind, (line, value) = by_line[-1] if len(by_line) > 1 else by_line[0]
    why = (
        f"but line {first_line} holds a {first_kind}"
        if len(by_line) > 1
        else "which is no target kind (a bool or an object)"
    )
    raise ValueError(
        f"{shown}:{line}: column {name!r} holds {repr(value)[:60]} ({bad_kind}), {why}; make "
        "every value of the column one kind (text, number, list of names, list of boxes), "
        "or give its kind with columns="
    )


def _json_kind(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, list):
        if not v:
            return "empty"
        if all(isinstance(x, str) for x in v):
            return "multilabel"
        return "boxes" if all(isinstance(x, list) for x in v) else "other"
    return {int: "int", float: "float", str: "text"}.get(type(v), "other")  # bool: other


def _number(v: object) -> int | float | None:
    """A CSV field as a number, or None when it is not one."""
    if not isinstance(v, str):
        return None
    if _INT.fullmatch(v):
        return int(v)
    return float(v) if len(v) <= 64 and _FLOAT.fullmatch(v) else None


def _class_names(kind: str, v: object, csv: bool) -> list[str]:
    """The class names a multilabel or boxes value uses; ``[]`` for a malformed one."""
    items = _parse_list(v, csv, sep=kind == "multilabel")
    if items is None:
        return []
    if kind == "multilabel":
        return [x for x in items if _is_name(x)]  # type: ignore[misc]
    return [b[4] for b in items if isinstance(b, list) and len(b) in (5, 6) and _is_name(b[4])]


def _parse_list(v: object, csv: bool, *, sep: bool) -> list[object] | None:
    if csv and isinstance(v, str):
        if sep:
            return list(v.split("|")) if v else []
        try:
            v = parse_json(v, what="listing cell", name=v[:40]) if v else []
        except DocumentError:
            return None
    return v if isinstance(v, list) else None
