"""What a source hands the catalog: the samples found, their classes, targets and left-outs.

Each source (the ImageFolder walk, a listing, COCO, a paired folder) makes a :class:`SourceSamples`;
:mod:`h5forge.discover.catalog` sorts it into a :class:`~h5forge.discover.catalog.Catalog`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from h5forge.discover.folder import Found
from h5forge.targets.schema import Schema

__all__ = ["UNLABELLED", "SourceSamples"]

#: The one class of a source that gives no image-level class (COCO, a segmentation folder):
#: every sample has label 0, named this.
UNLABELLED = "unlabelled"


@dataclass
class SourceSamples:
    """The samples of one source, unsorted.

    Attributes:
        found: one ``(split, class, relpath, path)`` per sample.
        classes: the class names, sorted (or ``"0".."K-1"`` for integer labels).
        splits: split names present, in ``SPLIT_NAMES`` order.
        skipped: reason -> entries left out.
        schema: the target columns.
        targets: relpath -> the sample's raw target values, one per column.
        rejected: ``(relpath, reason)`` quarantined, in source order.
    """

    found: list[Found]
    classes: tuple[str, ...]
    splits: tuple[str, ...]
    skipped: Counter[str] = field(default_factory=Counter)
    schema: Schema = ()
    targets: dict[str, tuple[object, ...]] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
