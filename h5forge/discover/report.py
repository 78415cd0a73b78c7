"""The catalog in words for the build report: its class and target columns.

:func:`describe` states the schema discovery found (inferred or given), so a user sees what a
pack will store before it runs.
"""

from __future__ import annotations

from h5forge.discover.catalog import Catalog
from h5forge.discover.listing import UNLABELLED

__all__ = ["describe"]


def describe(catalog: Catalog) -> str:
    """The catalog's targets in words, for the build report.

    ``"targets: class (3 classes), boxes (boxes, 80 classes), caption (text), score (number,
    float64)"``; the class is left out when every sample is :data:`UNLABELLED`, and
    ``"; N quarantined"`` is added when discovery quarantined rows.
    """
    parts: list[str] = []
    if catalog.classes != (UNLABELLED,):
        parts.append(f"class ({_classes(len(catalog.classes))})")
    for c in catalog.schema:
        detail: list[str] = [c.kind]
        if c.kind in ("multilabel", "boxes"):
            detail.append(_classes(len(c.classes)))
        if c.dtype is not None:
            detail.append(c.dtype)
        parts.append(f"{c.name} ({', '.join(detail)})")
    text = "targets: " + ", ".join(parts)
    return text + (f"; {len(catalog.rejected):,} quarantined" if catalog.rejected else "")


def _classes(n: int) -> str:
    return f"{n:,} class" + ("" if n == 1 else "es")
