"""A mask drawn from shapes instead of read from a file: COCO segmentations (polygons, RLE).

:class:`~h5forge.targets.shapes.Drawn` is the raw value of a ``mask`` column whose source
gives shapes, not mask images (:mod:`h5forge.discover.coco_masks`): the image's size and, in
paint order, each shape with the pixel value it paints. The pack draws it (:func:`draw`, in
the worker that decodes the image) into an ``L`` image of that size, which then takes the
image's geometry like a mask file would (:func:`h5forge.targets.geometry.move_mask`).

Shapes, as COCO writes them (coordinates in pixels of the image as stored):

* ``polygon``: one or more polygons ``[x1, y1, x2, y2, ...]``, filled with Pillow's
  ``ImageDraw.polygon`` (edge pixels may differ from pycocotools' rasteriser by one);
* ``rle``: a run-length encoding of the whole image, column-major, runs alternating from
  0 — uncompressed (a list of counts) or compressed (COCO's ASCII string, 6 bits a character).

Bounded by what the source can justify (:meth:`~h5forge.targets.shapes.Drawn.problem`): at
most ``MAX_POINTS`` polygon points an image, and a drawing budget of ``MAX_DRAWN_PIXELS``
(each polygon costs its bounding box, each RLE the whole image), so no annotation file makes a
worker draw for minutes. A shape that breaks a rule is a
:class:`~h5forge.targets.schema.TargetError` (the image is quarantined with the reason).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from h5forge.targets.schema import TargetError
from h5forge.targets.shapes import Drawn

__all__ = ["decode_rle", "draw"]


def draw(d: Drawn, max_pixels: int) -> Image.Image:
    """The mask ``d`` as an ``L`` image of its size.

    Raises:
        TargetError: the mask has more than ``max_pixels`` pixels, breaks a bound
            (:meth:`~h5forge.targets.shapes.Drawn.problem`), or an RLE does not decode to the
            image's size.
    """
    bad = d.problem()
    if bad is not None:
        raise TargetError(f"bad target: {bad}")
    w, h = d.size
    if w * h > max_pixels:
        raise TargetError(
            f"bad target: mask too large: {w} x {h} is over the limit of {max_pixels:,} pixels"
        )
    img = Image.new("L", (w, h), 0)
    pen = ImageDraw.Draw(img)
    for s in d.shapes:
        if s.kind == "polygon":
            xy = np.frombuffer(s.data, np.float32).reshape(-1, 2).astype(np.float64)
            at = 0
            for n in s.sizes:
                pen.polygon([tuple(p) for p in xy[at : at + n].tolist()], fill=s.value)
                at += n
            continue
        counts = (
            np.frombuffer(s.data, np.uint32).astype(np.int64)
            if s.sizes == (0,)
            else decode_rle(s.data)
        )
        if counts.min(initial=0) < 0 or int(counts.sum()) != w * h:
            raise TargetError(
                f"bad target: an RLE mask's runs cover {int(counts.sum()):,} pixels (some "
                f"negative: {bool(counts.min(initial=0) < 0)}), the image {w} x {h} = {w * h:,}"
            )
        runs = np.repeat((np.arange(len(counts)) % 2 * 255).astype(np.uint8), counts)
        on = Image.fromarray(np.ascontiguousarray(runs.reshape(w, h).T))
        img.paste(s.value, mask=on)
    return img


def decode_rle(text: bytes) -> np.ndarray:
    """The counts of COCO's compressed RLE string (ASCII bytes): each count in 5-bit groups,
    low first, a character each (``chr(48 + group)``, bit 6 set while more follow, bit 5 of the
    last the sign); from the fourth count on, each is a difference from the count two before.
    Decoded with whole-array operations (the string is at most
    :data:`~h5forge.targets.shapes.MAX_RLE_CHARS`).

    Raises:
        TargetError: a character out of the alphabet, a count of over 40 bits, or the string
            ends inside a count.
    """
    c = np.frombuffer(text, np.uint8).astype(np.int64) - 48
    if ((c < 0) | (c >= 64)).any():
        raise TargetError("bad target: an RLE string holds a character outside COCO's alphabet")
    if not len(c):
        return np.zeros(0, np.int64)
    more = (c & 0x20) != 0
    if more[-1]:
        raise TargetError("bad target: an RLE string ends inside a count")
    ends = np.flatnonzero(~more)
    starts = np.concatenate([[0], ends[:-1] + 1])
    chars = ends - starts + 1
    if chars.max() > 8:  # 40 bits: no image has that many pixels
        raise TargetError("bad target: an RLE string holds a count of over 40 bits")
    shift = 5 * (np.arange(len(c)) - np.repeat(starts, chars))
    x = np.add.reduceat((c & 0x1F) << shift, starts)
    negative = (c[ends] & 0x10) != 0
    x[negative] -= np.left_shift(1, 5 * chars[negative])
    counts = x.copy()  # counts[m] = x[m] + counts[m - 2] for m > 2
    counts[1::2] = np.cumsum(x[1::2])
    counts[2::2] = np.cumsum(x[2::2])
    return counts
