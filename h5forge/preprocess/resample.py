"""Resize, orient and crop decoded pixels held as an array: the geometry of
:func:`h5forge.preprocess.normalise.apply`, with the kernel of ``ImageConfig.resample``.

The array path (every configuration but ``decoder="pillow", resample="pillow"``) resizes in
the file's own orientation, then applies the EXIF transposition to the small result, then
crops: a transposition commutes with the resize (the filter is symmetric), and the pixels a
DCT-scaled decode adds at the far edge (the image spans ``W / scale`` of its
``ceil(W / scale)`` columns) then always lie past the region, never before it.

``"torch"`` is torch's antialiased bilinear on uint8 (``interpolate(..., antialias=True)``,
torchvision's ``Resize`` on tensors): the filter, support and centres of Pillow's BILINEAR,
in SIMD fixed point, so its pixels are Pillow's within rounding (benchmarks/RESULTS.md:
mean PSNR 75 dB, worst image 55 dB on real photos). It is called with explicit scales, so
a partial last column or row of a scaled decode is sampled as Pillow's ``box`` samples it.
``"pillow"`` is Pillow's own resize over that box.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from h5forge.preprocess.config import Resample
from h5forge.preprocess.normalise import Plan

__all__ = ["ORIENT", "resize_orient_crop"]

#: EXIF orientation -> the numpy view that transposes an (H, W, C) array as
#: :data:`h5forge.preprocess.normalise.TRANSPOSE` transposes an image.
ORIENT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
    8: lambda a: np.rot90(a, 1),
}


def resize_orient_crop(
    arr: np.ndarray,
    *,
    plan: Plan | None,
    orientation: int,
    extent: tuple[float, float],
    kernel: Resample,
) -> np.ndarray:
    """The stored pixels of ``arr`` (a view where no copy was needed).

    Args:
        arr: ``(h, w, C)`` uint8, C-contiguous, in the file's orientation.
        plan: the resize plan (logical coordinates), or None to keep the size.
        orientation: the EXIF orientation, 1..8.
        extent: ``(W, H)`` the whole image spans in ``arr``: its size, or ``file size /
            scale`` for a DCT-scaled decode (at most the size).
        kernel: the resize kernel.

    Returns:
        ``(H, W, C)`` uint8 in logical orientation, resized and cropped per ``plan``.
    """
    if plan is not None:
        out_w, out_h = plan.size[::-1] if orientation >= 5 else plan.size
        if (out_w, out_h) != (arr.shape[1], arr.shape[0]) or extent != (
            float(arr.shape[1]),
            float(arr.shape[0]),
        ):
            arr = _resize(arr, (out_w, out_h), extent, kernel)
    if orientation in ORIENT:
        arr = ORIENT[orientation](arr)
    if plan is not None and plan.crop is not None:
        left, top, right, bottom = plan.crop
        arr = arr[top:bottom, left:right]
    return arr


def _resize(
    arr: np.ndarray, size: tuple[int, int], extent: tuple[float, float], kernel: Resample
) -> np.ndarray:
    w, h = size
    if kernel == "pillow":
        img = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        box = (0.0, 0.0, extent[0], extent[1])
        out = np.asarray(img.resize(size, Image.Resampling.BILINEAR, box=box))
        return out[:, :, None] if out.ndim == 2 else out
    # (1, C, h, w) over the same memory, channels-last: torch's uint8 SIMD path. The private
    # aten op is what interpolate() calls; it alone takes an output size and the scales
    # together (the scales place a partial edge; the size is exact, no float floor).
    # The result is written into an (h, w, C) array of ours, channels-last like the input:
    # the op's own result is (1, C, h, w) contiguous, converted from the channels-last one it
    # computes, and reading that back as (h, w, C) gathers byte by byte. Same pixels, and
    # 2.4x faster than resizing and copying out (benchmarks/RESULTS.md, issue 31).
    if not arr.flags.writeable:  # Pillow's arrays are read-only; torch warns on those
        arr = arr.copy()
    x = torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)
    out = np.empty((h, w, arr.shape[2]), np.uint8)
    y = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
    torch.ops.aten._upsample_bilinear2d_aa.out(
        x, [h, w], False, h / extent[1], w / extent[0], out=y
    )
    return out
