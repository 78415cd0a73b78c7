"""The steps :mod:`h5forge.preprocess.decode` composes: checked open, mode rules and resize
geometry.

The rules themselves are documented in :mod:`h5forge.preprocess.decode`.

Coordinates are "logical": those of the full-resolution image after EXIF transposition. A JPEG
decoded with DCT scaling (``Image.draft``) covers the same logical image at a lower resolution,
described by a *region* (the logical image's extent in the drafted pixels), so the output
geometry is the same with or without the draft.
"""

from __future__ import annotations

import io
import threading
from typing import NamedTuple

import numpy as np
from PIL import Image

from h5forge.preprocess.config import ImageConfig

__all__ = [
    "TRANSPOSE",
    "Plan",
    "apply",
    "dct_scale",
    "draft",
    "normalise_mode",
    "open_checked",
    "orientation",
    "plan",
]

Box = tuple[float, float, float, float]

TRANSPOSE = {  # EXIF orientation -> transposition, as ImageOps.exif_transpose does it
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# Image.MAX_IMAGE_PIXELS is process-global. It is None only while one header is parsed, and the
# lock keeps concurrent calls from restoring each other's temporary value (another thread's own
# Image.open at that instant would skip Pillow's check; workers are processes, so none does).
_LIMIT_LOCK = threading.Lock()


class Plan(NamedTuple):
    """Resize to ``size`` (W, H), then crop ``crop`` (left, top, right, bottom) if set."""

    size: tuple[int, int]
    crop: tuple[int, int, int, int] | None


def plan(file_size: tuple[int, int], orient: int, cfg: ImageConfig) -> Plan | None:
    """The resize plan for an image whose header says ``file_size`` (W, H); None: no resize."""
    if cfg.resize == "none" or cfg.size is None:
        return None
    w, h = file_size[::-1] if orient >= 5 else file_size
    out_h, out_w = cfg.size
    if cfg.resize == "resize":
        return Plan((out_w, out_h), None)
    side = cfg.shorter_side or max(out_h, out_w)
    # torchvision.transforms.Resize(side) then CenterCrop((out_h, out_w)), same arithmetic.
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(side * long / short)
    new_w, new_h = (side, new_long) if w <= h else (new_long, side)
    top = int(round((new_h - out_h) / 2.0))
    left = int(round((new_w - out_w) / 2.0))
    return Plan((new_w, new_h), (left, top, left + out_w, top + out_h))


def dct_scale(file_size: tuple[int, int], p: Plan, orient: int) -> int:
    """The DCT scaling denominator (1, 2, 4 or 8) for a JPEG of ``file_size`` (W, H): the
    largest power of two that still covers ``p.size``, and 1 unless the image is at least
    twice the size in both axes. Pillow's ``draft`` rule, shared by every decoder."""
    need_w, need_h = p.size[::-1] if orient >= 5 else p.size
    factor = min(file_size[0] // need_w, file_size[1] // need_h)
    return next((a for a in (8, 4, 2) if factor >= a), 1)


def draft(img: Image.Image, p: Plan, orient: int) -> Box | None:
    """Ask libjpeg to decode at 1/2, 1/4 or 1/8 scale when that still covers ``p.size``.

    Returns the logical image's region in the (transposed) drafted pixels, or None when the
    image is decoded at full size.
    """
    if dct_scale(img.size, p, orient) < 2:
        return None
    need_w, need_h = p.size[::-1] if orient >= 5 else p.size
    result = img.draft(None, (need_w, need_h))
    if result is None:
        return None
    _, (_, _, extent_w, extent_h) = result
    if (extent_w, extent_h) == img.size:
        return None
    # Where the logical extent [0, extent) lands after transposition: swapped axes for
    # orientations 5-8, and flipped axes measure from the far edge.
    swap = orient >= 5
    len_x, ext_x = (img.height, extent_h) if swap else (img.width, extent_w)
    len_y, ext_y = (img.width, extent_w) if swap else (img.height, extent_h)
    x0 = len_x - ext_x if orient in (2, 3, 6, 7) else 0.0
    y0 = len_y - ext_y if orient in (3, 4, 7, 8) else 0.0
    return (x0, y0, x0 + ext_x, y0 + ext_y)


def apply(img: Image.Image, p: Plan, region: Box | None) -> Image.Image:
    """Resize (BILINEAR, antialiased like torchvision on PIL images) and crop per ``p``.

    With a crop, only the crop's source region is resampled (Pillow's ``box``): the geometry,
    filter and weights of resizing the whole image and then cropping, at 0.64x its CPU for a
    4:3 photo. Pillow derives the weights from the box in floating point, so its fixed-point
    rounding differs by 1 on about 0.02% of the values from resize-then-crop.
    """
    full: Box = region or (0.0, 0.0, float(img.width), float(img.height))
    new_w, new_h = p.size
    bilinear = Image.Resampling.BILINEAR
    if p.crop is None:
        if region is None and img.size == p.size:
            return img
        return img.resize(p.size, bilinear, box=full)
    left, top, right, bottom = p.crop
    if region is None and img.size == p.size:
        return img.crop(p.crop)
    sx = (full[2] - full[0]) / new_w
    sy = (full[3] - full[1]) / new_h
    box = (full[0] + left * sx, full[1] + top * sy, full[0] + right * sx, full[1] + bottom * sy)
    return img.resize((right - left, bottom - top), bilinear, box=box)


def open_checked(raw: bytes, limit: int) -> Image.Image:
    """Open (header only) and refuse more than ``limit`` pixels with DecompressionBombError."""
    # Pillow checks its global limit while parsing the header; switch it off for that moment
    # and apply the per-config limit to the header size instead (no pixel is allocated yet).
    with _LIMIT_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            img = Image.open(io.BytesIO(raw))
        finally:
            Image.MAX_IMAGE_PIXELS = saved
    w, h = img.size
    if w * h > limit:
        raise Image.DecompressionBombError(
            f"image too large: {w} x {h} = {w * h} pixels > limit {limit}"
        )
    return img


def orientation(img: Image.Image) -> int:
    """The EXIF orientation, 1..8; 1 when absent or invalid."""
    value = img.getexif().get(0x0112, 1)
    return value if isinstance(value, int) and 2 <= value <= 8 else 1


def normalise_mode(img: Image.Image, mode: str) -> Image.Image:
    """Bit depth, transparency and colour rules of :mod:`h5forge.preprocess.decode`, to ``mode``."""
    if img.mode.startswith("I;16"):
        img = Image.fromarray((np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8))
    elif img.mode in ("I", "F"):
        arr = np.nan_to_num(np.asarray(img), nan=0.0, posinf=255.0, neginf=0.0)
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    elif img.mode == "1":
        img = img.convert("L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode in ("L", "RGB") and "transparency" in img.info:
        img = img.convert("RGBA")
    elif img.mode in ("PA", "La"):
        img = img.convert("RGBA" if img.mode == "PA" else "LA")
    if img.mode in ("RGBA", "RGBa", "LA"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")  # CMYK (and YCCK, opened as CMYK), YCbCr, HSV, RGBX, ...
    return img.convert(mode) if img.mode != mode else img
