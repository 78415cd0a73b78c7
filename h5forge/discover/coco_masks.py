"""COCO segmentations as a mask column: each image's polygons and RLE, checked, to be drawn.

With ``coco_masks`` (:func:`h5forge.discover.coco.coco_samples`), a COCO source gets a second
target column, ``segmentation`` (kind mask): one class-id mask per image, drawn by the pack
(:mod:`h5forge.targets.drawn`) from the annotations in file order, later ones over earlier:
an annotation paints ``1 +`` its class index (the ``boxes`` column's classes; 0 is
background), a crowd annotation (``iscrowd`` 1) paints :data:`CROWD` (255, the usual
``ignore_index``). So at most 254 categories. An annotation without ``segmentation`` paints
nothing.

Each image needs its ``width`` and ``height`` in the file (the mask's size: a mask of another
size than the image file is quarantined when packed). A malformed segmentation — a polygon of
odd length, of fewer than 3 points or of non-finite numbers, an RLE whose ``size`` is not the
image's, counts that are not non-negative integers, a string out of COCO's alphabet — or
shapes over :data:`~h5forge.targets.shapes.MAX_POINTS` or the drawing budget quarantine the
image with the reason.
"""

from __future__ import annotations

import numpy as np

from h5forge.targets.schema import TargetError
from h5forge.targets.shapes import MAX_COORDINATE, MAX_DRAWN_PIXELS, MAX_RLE_CHARS, Drawn, Shape
from h5forge.text import printable

__all__ = ["CROWD", "MAX_MASK_CLASSES", "WHERE", "drawn", "shape_of"]

CROWD = 255
MAX_MASK_CLASSES = CROWD - 1  # values 1..254
WHERE = "bad target: column 'segmentation'"


def shape_of(seg: object, value: int, size: tuple[int, int], where: str) -> Shape | None:
    """The shape of one annotation's ``segmentation`` painting ``value``; None when absent.

    Raises:
        TargetError: see the module docstring.
    """
    if seg is None:
        return None
    w, h = size
    if isinstance(seg, list):
        if not seg:
            return None
        polygons = seg if all(isinstance(p, list) for p in seg) else None
        if polygons is None or any(
            len(p) < 6
            or len(p) % 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in p)
            for p in polygons
        ):
            raise TargetError(
                f"{where}: segmentation {printable(repr(seg), limit=60)} is not a list of "
                "polygons [x1, y1, x2, y2, ...] of 3 points or more"
            )
        # Compared before float(): an integer of 400 digits does not convert; NaN fails too.
        if not all(abs(v) <= MAX_COORDINATE for p in polygons for v in p):
            raise TargetError(
                f"{where}: a polygon holds NaN, an infinite coordinate or one beyond "
                f"+-{MAX_COORDINATE:,}"
            )
        data = np.asarray([float(v) for p in polygons for v in p], np.float32).tobytes()
        return Shape(value, "polygon", data, tuple(len(p) // 2 for p in polygons))
    if not isinstance(seg, dict) or seg.get("size") != [h, w]:
        raise TargetError(
            f"{where}: segmentation {printable(repr(seg), limit=60)} is neither polygons nor "
            f"an RLE of the image's size [{h}, {w}]"
        )
    if w * h > MAX_DRAWN_PIXELS:
        raise TargetError(
            f"{where}: an RLE of a {w} x {h} image, over the drawing limit of "
            f"{MAX_DRAWN_PIXELS:,} pixels"
        )
    counts = seg.get("counts")
    if (
        isinstance(counts, str)
        and counts.isascii()
        and len(counts) <= min(8 * (w * h + 1), MAX_RLE_CHARS)
    ):
        return Shape(value, "rle", counts.encode("ascii"), ())
    if (
        isinstance(counts, list)
        and len(counts) <= w * h + 1
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= w * h for c in counts)
    ):
        return Shape(value, "rle", np.asarray(counts, np.uint32).tobytes(), (0,))
    raise TargetError(
        f"{where}: RLE counts {printable(repr(counts), limit=60)} are neither COCO's string "
        f"(ASCII, at most {min(8 * (w * h + 1), MAX_RLE_CHARS):,} characters) nor a list of "
        f"run lengths 0..{w * h}"
    )


def drawn(size: tuple[int, int], shapes: list[Shape], where: str) -> Drawn:
    """An image's mask value, its shapes within the bounds (:meth:`Drawn.problem`).

    Raises:
        TargetError: over :data:`~h5forge.targets.shapes.MAX_POINTS` points, or the
            drawing budget.
    """
    value = Drawn(size, tuple(shapes))
    bad = value.problem()
    if bad is not None:
        raise TargetError(f"{where}: {bad}")
    return value
