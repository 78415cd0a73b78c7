"""Move boxes and masks with their image: EXIF orientation, then the pack's resize and crop.

Source coordinates are those of the source file's pixel grid, as Pillow opens it (before EXIF
orientation), with pixel edges at integers: a box ``(0, 0, W, H)`` covers the whole image. The
image goes through three steps (:mod:`h5forge.preprocess.normalise`): the EXIF transposition,
a resize to ``plan.size`` and a crop to ``plan.crop``. A box goes through the same three, exactly
(every step maps rectangles to rectangles), and is then clipped to the stored image; a box left
with no area is dropped and counted. A mask goes through the transposition, a NEAREST resize of
the whole mask to ``plan.size`` and the crop, so every stored value is a value of the source
mask (no class id is invented by interpolation).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from PIL import Image

from h5forge.preprocess.normalise import TRANSPOSE, Plan

__all__ = ["Geometry", "check_mask_size", "move_boxes", "move_mask"]


class Geometry:
    """What happened to one image: ``file_size`` (W, H) of the source grid, its EXIF
    ``orientation`` (1..8) and the resize ``plan`` (None: the size was kept)."""

    __slots__ = ("file_size", "orientation", "plan")

    def __init__(
        self, file_size: tuple[int, int], orientation: int = 1, plan: Plan | None = None
    ) -> None:
        self.file_size = (int(file_size[0]), int(file_size[1]))
        self.orientation = orientation
        self.plan = plan

    def __repr__(self) -> str:
        return f"Geometry({self.file_size}, {self.orientation}, {self.plan})"

    @property
    def logical_size(self) -> tuple[int, int]:
        """(W, H) after the transposition."""
        w, h = self.file_size
        return (h, w) if self.orientation >= 5 else (w, h)

    @property
    def out_size(self) -> tuple[int, int]:
        """(W, H) of the stored image."""
        if self.plan is None:
            return self.logical_size
        if self.plan.crop is None:
            return self.plan.size
        left, top, right, bottom = self.plan.crop
        return (right - left, bottom - top)


class Moved(NamedTuple):
    """Boxes in stored-image pixels, ``(M, 6) float32`` rows ``x1, y1, x2, y2, class,
    iscrowd``, and how many source boxes were dropped (no area left after clipping)."""

    boxes: np.ndarray
    dropped: int


def move_boxes(boxes: object, g: Geometry) -> Moved:
    """Apply ``g`` to ``(M, 6)`` source boxes (see :mod:`h5forge.targets.schema`)."""
    b = np.asarray(boxes, np.float64).reshape(-1, 6).copy()
    if not len(b):
        return Moved(np.zeros((0, 6), np.float32), 0)
    w, h = g.file_size
    x1, y1, x2, y2 = (b[:, k].copy() for k in range(4))
    o = g.orientation
    # Where the corners land under Pillow's transposition (continuous coordinates).
    if o == 2:
        x1, x2 = w - x2, w - x1
    elif o == 3:
        x1, x2, y1, y2 = w - x2, w - x1, h - y2, h - y1
    elif o == 4:
        y1, y2 = h - y2, h - y1
    elif o == 5:  # TRANSPOSE: (x, y) -> (y, x)
        x1, y1, x2, y2 = y1, x1, y2, x2
    elif o == 6:  # ROTATE_270 (clockwise): (x, y) -> (h - y, x)
        x1, y1, x2, y2 = h - y2, x1, h - y1, x2
    elif o == 7:  # TRANSVERSE: (x, y) -> (h - y, w - x)
        x1, y1, x2, y2 = h - y2, w - x2, h - y1, w - x1
    elif o == 8:  # ROTATE_90 (counter-clockwise): (x, y) -> (y, w - x)
        x1, y1, x2, y2 = y1, w - x2, y2, w - x1
    if g.plan is not None:
        lw, lh = g.logical_size
        sx, sy = g.plan.size[0] / lw, g.plan.size[1] / lh
        x1, x2, y1, y2 = x1 * sx, x2 * sx, y1 * sy, y2 * sy
        if g.plan.crop is not None:
            left, top = g.plan.crop[:2]
            x1, x2, y1, y2 = x1 - left, x2 - left, y1 - top, y2 - top
    out_w, out_h = g.out_size
    x1, x2 = np.clip(x1, 0, out_w), np.clip(x2, 0, out_w)
    y1, y2 = np.clip(y1, 0, out_h), np.clip(y2, 0, out_h)
    b[:, 0], b[:, 1], b[:, 2], b[:, 3] = x1, y1, x2, y2
    keep = (x2 > x1) & (y2 > y1)
    return Moved(b[keep].astype(np.float32), int((~keep).sum()))


def check_mask_size(size: tuple[int, int], g: Geometry) -> None:
    """Refuse a mask whose (width, height) ``size`` is not the source file's.

    Raises:
        ValueError: the message gives both sizes.
    """
    if tuple(size) != tuple(g.file_size):
        raise ValueError(
            f"mask of another size: {size[0]} x {size[1]}, the image is "
            f"{g.file_size[0]} x {g.file_size[1]}"
        )


def move_mask(mask: Image.Image, g: Geometry) -> np.ndarray:
    """Apply ``g`` to a mask of the source file's size; ``(H, W) uint8`` of the stored size.

    Raises:
        ValueError: the mask is not of the source file's size (the message gives both).
    """
    check_mask_size(mask.size, g)
    if g.orientation != 1:
        mask = mask.transpose(TRANSPOSE[g.orientation])
    if g.plan is not None:
        if mask.size != g.plan.size:
            mask = mask.resize(g.plan.size, Image.Resampling.NEAREST)
        if g.plan.crop is not None:
            mask = mask.crop(g.plan.crop)
    return np.ascontiguousarray(np.asarray(mask, np.uint8))
