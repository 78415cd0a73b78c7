"""The rules every stored target row keeps, in one place for whoever reads a file someone else
wrote: the reader as it reads (:mod:`h5forge.read.targets`) and ``verify``
(:mod:`h5forge.verify.targets`). Each returns a boolean per row: ``True`` where a row breaks
them. The rules a raw value keeps before packing are :func:`h5forge.targets.schema.check_value`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bad_boxes", "bad_labels"]


def bad_labels(values: np.ndarray, num_classes: int) -> np.ndarray:
    """Class indices outside ``0..num_classes-1``."""
    return (values < 0) | (values >= num_classes)


def bad_boxes(
    rows: np.ndarray, num_classes: int, size: tuple[int, int] | None = None
) -> np.ndarray:
    """``(M, 6)`` box rows ``x1, y1, x2, y2, class, iscrowd`` that are not finite and ordered
    (``x1 <= x2``, ``y1 <= y2``), whose class is not an index below ``num_classes``, whose
    iscrowd is not 0 or 1, or (with ``size``, the stored image's ``(H, W)``) that leave the
    image."""
    b = rows.astype(np.float64, copy=False)
    cls = b[:, 4]
    bad = (
        ~np.isfinite(b).all(axis=1)
        | (b[:, 2] < b[:, 0])
        | (b[:, 3] < b[:, 1])
        | (cls < 0)
        | (cls >= num_classes)
        | (cls != np.floor(cls))
        | ~np.isin(b[:, 5], (0.0, 1.0))
    )
    if size is not None:
        h, w = size
        bad |= (b[:, 0] < 0) | (b[:, 1] < 0) | (b[:, 2] > w) | (b[:, 3] > h)
    return bad
