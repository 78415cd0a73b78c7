"""The catalog in words for the build report: its class and target columns.

:func:`describe` states the schema discovery found (inferred or given), so a user sees what a
pack will store before it runs; :func:`describe_columns` words a schema (``h5forge inspect``
states a file's with it).
"""

from __future__ import annotations

from collections.abc import Sequence

from h5forge.discover.catalog import Catalog
from h5forge.discover.listing import UNLABELLED
from h5forge.targets.schema import Column

__all__ = ["describe", "describe_columns"]


def describe(catalog: Catalog) -> str:
    """The catalog's targets in words, for the build report.

    ``"targets: class (3 classes), boxes (boxes, 80 classes), caption (text), score (number,
    float64)"``; the class is left out when every sample is :data:`UNLABELLED`, and
    ``"; N quarantined"`` is added when discovery quarantined rows.
    """
    parts = (
        [f"class ({_classes(len(catalog.classes))})"] if catalog.classes != (UNLABELLED,) else []
    )
    if catalog.schema:
        parts.append(describe_columns(catalog.schema))
    text = "targets: " + ", ".join(parts)
    return text + (f"; {len(catalog.rejected):,} quarantined" if catalog.rejected else "")


def describe_columns(schema: Sequence[Column]) -> str:
    """``"boxes (boxes, 80 classes), seg (mask, raw), score (number, float64)"``: each
    column's name, kind, classes, dtype, and a packed mask's encoding."""
    parts: list[str] = []
    for c in schema:
        detail: list[str] = [c.kind]
        if c.kind in ("multilabel", "boxes"):
            detail.append(_classes(len(c.classes)))
        if c.dtype is not None:
            detail.append(c.dtype)
        if c.encoding:
            detail.append(c.encoding)
        parts.append(f"{c.name} ({', '.join(detail)})")
    return ", ".join(parts)


def _classes(n: int) -> str:
    return f"{n:,} class" + ("" if n == 1 else "es")
