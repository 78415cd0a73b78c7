"""Target columns in words, one way everywhere: the build report
(:func:`h5forge.discover.report.describe`), ``h5forge inspect``, and the messages that compare
two assets' columns (:func:`h5forge.read.asset_list.check_same_targets`)."""

from __future__ import annotations

from collections.abc import Sequence

from h5forge.targets.schema import Column

__all__ = ["count_classes", "describe_columns"]


def describe_columns(schema: Sequence[Column]) -> str:
    """``"boxes (boxes, 80 classes), seg (mask, raw), score (number, float64)"``: each
    column's name, kind, classes, dtype, and a packed mask's encoding."""
    parts: list[str] = []
    for c in schema:
        detail: list[str] = [c.kind]
        if c.kind in ("multilabel", "boxes"):
            detail.append(count_classes(len(c.classes)))
        if c.dtype is not None:
            detail.append(c.dtype)
        if c.encoding:
            detail.append(c.encoding)
        parts.append(f"{c.name} ({', '.join(detail)})")
    return ", ".join(parts)


def count_classes(n: int) -> str:
    """``"1 class"``, ``"1,000 classes"``."""
    return f"{n:,} class" + ("" if n == 1 else "es")
