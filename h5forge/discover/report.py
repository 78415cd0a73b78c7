"""The catalog in words for the build report: its class and target columns.

:func:`describe` states the schema discovery found (inferred or given), so a user sees what a
pack will store before it runs (the columns worded by
:func:`h5forge.targets.words.describe_columns`).
"""

from __future__ import annotations

from h5forge.discover.catalog import Catalog
from h5forge.discover.source_samples import UNLABELLED
from h5forge.targets.words import count_classes, describe_columns

__all__ = ["describe"]


def describe(catalog: Catalog) -> str:
    """The catalog's targets in words, for the build report.

    ``"targets: class (3 classes), boxes (boxes, 80 classes), caption (text), score (number,
    float64)"``; the class is left out when every sample is :data:`UNLABELLED`, and
    ``"; N quarantined"`` is added when discovery quarantined rows.
    """
    parts = (
        [f"class ({count_classes(len(catalog.classes))})"]
        if catalog.classes != (UNLABELLED,)
        else []
    )
    if catalog.schema:
        parts.append(describe_columns(catalog.schema))
    text = "targets: " + ", ".join(parts)
    return text + (f"; {len(catalog.rejected):,} quarantined" if catalog.rejected else "")
