"""The raw value of a mask drawn from shapes (COCO segmentations): what discover makes and
the pack draws (:mod:`h5forge.targets.drawn`). Plain data, importing nothing of the library,
so the schema's checks can know it (:meth:`Drawn.problem`, checked again before drawing: a
catalog built by hand is not one discover checked).

The bounds hold the drawing of one image to about a second, whatever the annotation file says:
at most :data:`MAX_POINTS` polygon points, coordinates within :data:`MAX_COORDINATE`, compressed
RLE strings of at most :data:`MAX_RLE_CHARS`, and a drawing cost of at most
:data:`MAX_DRAWN_PIXELS` (:meth:`Shape.cost`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "MAX_COORDINATE",
    "MAX_DRAWN_PIXELS",
    "MAX_POINTS",
    "MAX_RLE_CHARS",
    "Drawn",
    "Shape",
]

#: Polygon points an image's shapes may have in all (COCO's densest image has ~10k).
MAX_POINTS = 1 << 20
#: A polygon coordinate, in pixels: beyond any image, and exact in float32.
MAX_COORDINATE = 1 << 24
#: Characters of one compressed RLE string (an image of 4 million runs).
MAX_RLE_CHARS = 1 << 22
#: What an image's shapes may cost to draw, in pixels (:meth:`Shape.cost`).
MAX_DRAWN_PIXELS = 1 << 28
#: Pillow fills a polygon row by row, visiting every edge on each row of its bounding box: a
#: row-edge costs about as much as this many pixels.
_ROW_EDGE = 8
#: Decoding a character of a compressed RLE costs about as much as this many pixels.
_RLE_CHAR = 64


@dataclass(frozen=True)
class Shape:
    """One shape: ``value`` (0..255) paints ``kind`` ``"polygon"`` (``data``: float32 bytes of
    x, y pairs, ``sizes``: points of each polygon) or ``"rle"`` (``data``: the compressed
    string's ASCII bytes with ``sizes == ()``, or uint32 bytes of the counts with
    ``sizes == (0,)``)."""

    value: int
    kind: str
    data: bytes
    sizes: tuple[int, ...]

    def problem(self) -> str | None:
        """What makes the shape unusable, or None."""
        if type(self.value) is not int or not 0 <= self.value <= 255:
            return f"paints {self.value!r:.20}, not an integer 0..255"
        if not isinstance(self.data, bytes) or not isinstance(self.sizes, tuple):
            return "is not bytes with a tuple of sizes"
        if any(type(n) is not int or n < 0 for n in self.sizes):
            return "has sizes that are not counts"
        if self.kind == "rle":
            if self.sizes == (0,):
                return "has RLE counts of a partial uint32" if len(self.data) % 4 else None
            if self.sizes or not self.data.isascii() or len(self.data) > MAX_RLE_CHARS:
                return f"is an RLE string that is not ASCII of at most {MAX_RLE_CHARS:,} characters"
            return None
        if self.kind != "polygon":
            return f"is a {self.kind!r:.20}, neither a polygon nor an RLE"
        if not self.sizes or min(self.sizes) < 3 or len(self.data) != 8 * sum(self.sizes):
            return "has polygons of fewer than 3 points, or points that do not match their data"
        xy = np.frombuffer(self.data, np.float32)
        if not (np.abs(xy) <= MAX_COORDINATE).all():  # NaN compares False too
            return f"has a polygon coordinate that is NaN, infinite or beyond +-{MAX_COORDINATE:,}"
        return None

    def cost(self, width: int, height: int) -> int:
        """What drawing it on a ``width`` x ``height`` image costs, in pixels: an RLE the
        whole image, plus the decoding of its string; a polygon its bounding box, plus each of
        its points once per row of the box (how Pillow fills it)."""
        if self.kind == "rle":
            return width * height + (0 if self.sizes else _RLE_CHAR * len(self.data))
        xy = np.frombuffer(self.data, np.float32).reshape(-1, 2).astype(np.float64)
        lo = np.clip(xy.min(axis=0), 0, (width, height))
        hi = np.clip(xy.max(axis=0), 0, (width, height))
        box = int(np.prod(hi - lo + 1))
        return box + _ROW_EDGE * int(hi[1] - lo[1] + 1) * len(xy)


@dataclass(frozen=True)
class Drawn:
    """A mask of ``size`` (width, height) painted with ``shapes`` in order on 0."""

    size: tuple[int, int]
    shapes: tuple[Shape, ...]

    def problem(self) -> str | None:
        """What breaks the bounds (module docstring) or makes a shape unusable, or None."""
        size, shapes = self.size, self.shapes
        if (
            not isinstance(size, tuple)
            or len(size) != 2
            or any(type(n) is not int or n < 1 for n in size)
        ):
            return f"a mask of size {size!r:.40}, not (width, height) of at least 1 pixel"
        if not isinstance(shapes, tuple) or any(not isinstance(s, Shape) for s in shapes):
            return "shapes that are not a tuple of Shape"
        for s in shapes:
            bad = s.problem()
            if bad is not None:
                return f"a shape {bad}"
        points = sum(sum(s.sizes) for s in shapes if s.kind == "polygon")
        if points > MAX_POINTS:
            return f"{points:,} polygon points, over the limit of {MAX_POINTS:,}"
        w, h = size
        cost = sum(s.cost(w, h) for s in shapes)
        if cost > MAX_DRAWN_PIXELS:
            return (
                f"drawing its {len(shapes):,} shapes on {w} x {h} would cost {cost:,} pixels, "
                f"over the limit of {MAX_DRAWN_PIXELS:,}"
            )
        return None
