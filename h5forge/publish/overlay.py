"""Draw a sample's targets over its image for the preview grid: masks blended in colour (class
0, the background, left clear), boxes outlined in their class's colour with the class name.

Colours come from a fixed palette indexed by class id, so one class has one colour across the
grid and across builds. Coordinates are those of the stored image (what the file holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from h5forge.targets.schema import Column

__all__ = ["PALETTE", "draw_targets"]

#: 20 colours that stay apart on photos (tab20-like); class ``k`` takes ``PALETTE[k % 20]``.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
    (174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
    (196, 156, 148), (247, 182, 210), (199, 199, 199), (219, 219, 141), (158, 218, 229),
)  # fmt: skip
_ALPHA = 0.45
_MAX_DRAWN = 64  # boxes per tile: more would hide the image


def _colour_table() -> np.ndarray:
    table = np.array([PALETTE[k % len(PALETTE)] for k in range(256)], np.float32)
    return table


def draw_targets(
    pic: Image.Image, values: Mapping[str, Any], schema: Sequence[Column]
) -> Image.Image:
    """``pic`` (RGB, the stored size) with the mask and box columns of ``values`` drawn on.

    Args:
        pic: the sample's image.
        values: column name -> value as the reader returns it (a mask ``(H, W)`` array-like;
            boxes a mapping with ``boxes`` ``(M, 4)`` and ``labels`` ``(M,)``); other columns
            and missing names are ignored.
        schema: the file's columns (their kinds and class names).
    """
    out = pic.convert("RGB")
    for c in schema:
        if c.kind == "mask" and c.name in values:
            mask = np.asarray(values[c.name], np.uint8)
            if mask.shape != (out.height, out.width):
                continue  # never on the image's pixels when it does not cover them
            rgb = np.asarray(out, np.float32)
            colours = _colour_table()[mask]
            on = (mask > 0)[:, :, None]
            rgb = np.where(on, rgb * (1 - _ALPHA) + colours * _ALPHA, rgb)
            out = Image.fromarray(rgb.round().astype(np.uint8))
    draw = ImageDraw.Draw(out)
    for c in schema:
        if c.kind != "boxes" or c.name not in values:
            continue
        value = values[c.name]
        boxes = np.asarray(value["boxes"], np.float32).reshape(-1, 4)[:_MAX_DRAWN]
        labels = np.asarray(value["labels"], np.int64).reshape(-1)[:_MAX_DRAWN]
        width = max(1, round(max(out.size) / 150))
        for (x1, y1, x2, y2), k in zip(boxes.tolist(), labels.tolist(), strict=True):
            colour = PALETTE[int(k) % len(PALETTE)]
            draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=colour, width=width)
            name = c.classes[int(k)] if 0 <= int(k) < len(c.classes) else str(k)
            draw.text((x1 + 2, y1 + 1), name[:12], fill=colour)
    return out
