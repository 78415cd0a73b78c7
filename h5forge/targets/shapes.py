"""The raw value of a mask drawn from shapes (COCO segmentations): what discover makes and
the pack draws (:mod:`h5forge.targets.drawn`). Plain data, importing nothing of the library,
so the schema's checks can know it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Drawn", "Shape"]


@dataclass(frozen=True)
class Shape:
    """One shape: ``value`` (0..255) paints ``kind`` ``"polygon"`` (``data``: float32 bytes of
    x, y pairs, ``sizes``: points of each polygon) or ``"rle"`` (``data``: the compressed
    string's ASCII bytes, or uint32 bytes of the counts with ``sizes == (0,)``)."""

    value: int
    kind: str
    data: bytes
    sizes: tuple[int, ...]

    def cost(self, width: int, height: int) -> int:
        """Pixels drawing it may touch (see the module docstring)."""
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
