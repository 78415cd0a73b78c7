"""The rules a target value read from an untrusted file must keep (its layout was checked at
open, :mod:`h5forge.asset.target_layout`): class indices in range, boxes finite and not
inverted, checked as they are read, one sample or a whole batch at once."""

from __future__ import annotations

from typing import Any

import numpy as np

from h5forge.errors import IntegrityError
from h5forge.targets.rules import bad_boxes, bad_labels
from h5forge.targets.schema import Column

__all__ = ["VALUES", "bad_row", "damaged"]

#: dtype of each kind's ``values`` (number columns: their own dtype).
VALUES = {"multilabel": "int32", "boxes": "float32", "mask": "uint8", "text": "uint8"}


def damaged(where: str, what: str) -> IntegrityError:
    """An IntegrityError saying what is wrong with the file and what to do."""
    return IntegrityError(
        f"{where}: {what}; the file is damaged or not written by h5forge — re-fetch or re-pack it"
    )


def bad_row(c: Column, value: Any) -> int | None:
    """The first row of ``value`` (multilabel indices, boxes) its column's rules refuse."""
    if c.kind not in ("multilabel", "boxes") or not len(value):
        return None
    if c.kind == "multilabel":
        bad = bad_labels(value, len(c.classes))
    else:
        bad = bad_boxes(value, len(c.classes))
    return int(np.argmax(bad)) if bad.any() else None
