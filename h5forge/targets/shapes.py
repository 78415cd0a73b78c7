"""The raw value of a mask drawn from shapes (COCO segmentations): what discover makes and
the pack draws (:mod:`h5forge.targets.drawn`). Plain data, importing nothing of the library,
so the schema's checks can know it (:meth:`Drawn.problem`, checked again before drawing: a
catalog built by hand is not one discover checked)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_DRAWN_PIXELS", "MAX_POINTS", "Drawn", "Shape"]

#: Polygon points an image's shapes may have in all (COCO's densest image has ~10k).
MAX_POINTS = 1 << 20
#: Pixels an image's shapes may cost to draw: a polygon its bounding box, an RLE the image.
MAX_DRAWN_PIXELS = 1 << 30


@dataclass(frozen=True)
class Shape:
    """One shape: ``value`` (0..255) paints ``kind`` ``"polygon"`` (``data``: float32 bytes of
    x, y pairs, ``sizes``: points of each polygon) or ``"rle"`` (``data``: the compressed
    string's ASCII bytes, or uint32 bytes of the counts with ``sizes == (0,)``)."""

    value: int
    kind: str
    data: bytes
    sizes: tuple[int, ...]

    def problem(self) -> str | None:
        """What makes the shape unusable, or None."""
        if not 0 <= self.value <= 255:
            return f"paints {self.value}, outside 0..255"
        if self.kind == "rle":
            odd = self.sizes == (0,) and len(self.data) % 4
            return "RLE counts of a partial uint32" if odd else None
        if self.kind != "polygon":
            return f"is a {self.kind!r}, neither a polygon nor an RLE"
        if not self.sizes or min(self.sizes) < 3 or len(self.data) != 8 * sum(self.sizes):
            return "polygons of fewer than 3 points, or points that do not match their data"
        if not np.isfinite(np.frombuffer(self.data, np.float32)).all():
            return "a polygon holds NaN or an infinite coordinate"
        return None

    def cost(self, width: int, height: int) -> int:
        """Pixels drawing it may touch (see :data:`MAX_DRAWN_PIXELS`)."""
        if self.kind == "rle":
            return width * height
        xy = np.frombuffer(self.data, np.float32).reshape(-1, 2)
        lo = np.clip(xy.min(axis=0), 0, (width, height))
        hi = np.clip(xy.max(axis=0), 0, (width, height))
        return int(np.prod(hi - lo + 1))


@dataclass(frozen=True)
class Drawn:
    """A mask of ``size`` (width, height) painted with ``shapes`` in order on 0."""

    size: tuple[int, int]
    shapes: tuple[Shape, ...]

    def problem(self) -> str | None:
        """What breaks the bounds (:data:`MAX_POINTS`, :data:`MAX_DRAWN_PIXELS`) or makes a
        shape unusable, or None."""
        w, h = self.size
        if w < 1 or h < 1:
            return f"a mask of {w} x {h} pixels"
        for s in self.shapes:
            bad = s.problem()
            if bad is not None:
                return f"a shape {bad}"
        points = sum(sum(s.sizes) for s in self.shapes if s.kind == "polygon")
        if points > MAX_POINTS:
            return f"{points:,} polygon points, over the limit of {MAX_POINTS:,}"
        cost = sum(s.cost(w, h) for s in self.shapes)
        if cost > MAX_DRAWN_PIXELS:
            return (
                f"drawing its {len(self.shapes):,} shapes would touch {cost:,} pixels, over "
                f"the limit of {MAX_DRAWN_PIXELS:,}"
            )
        return None
