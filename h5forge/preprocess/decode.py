"""Decode one image's bytes into normalised pixels, and say what was done to it.

Normalisation rules, applied in this order to frame 0 of the file (animated GIF/APNG/WebP and
multi-page TIFF keep their first frame only):

1. EXIF orientation is applied (as ``ImageOps.exif_transpose`` does), so width and height swap
   for orientations 5-8.
2. Bit depth: 16-bit grey (``I;16``, ``I;16B``, ...) keeps the high byte (``value >> 8``);
   32-bit integer ``I`` and float ``F`` are clipped to 0..255 (floats truncated, NaN -> 0).
3. Transparency (``P`` with or without ``transparency``, ``PA``, ``RGBA``, ``LA``, and ``L`` /
   ``RGB`` with a tRNS colour key) is alpha-composited onto a WHITE background.
4. Colour: CMYK/YCCK, YCbCr, ``1`` and other modes go through Pillow's ``convert("RGB")``; grey
   becomes RGB by replication when ``mode="RGB"``; RGB becomes ``L`` with Pillow's ITU-R 601
   luma when ``mode="L"``.
5. Resize (``ImageConfig.resize``): ``"none"`` keeps the size; ``"resize"`` is
   ``Image.resize((W, H), BILINEAR)``; ``"shorter-side"`` is torchvision's
   ``Resize(S)`` + ``CenterCrop((H, W))`` on PIL images, computed by resampling only the crop's
   source region: the same geometry, filter and weights, but Pillow's fixed-point rounding
   differs by 1 on about 0.02% of the values (at 0.64x the CPU of resize-then-crop). JPEGs at
   least twice the needed size are first reduced by libjpeg's DCT scaling (``Image.draft``),
   never below the size the resize needs; the geometry is unchanged, the pixels differ
   slightly from a full-size decode.
6. Decoder and kernel (``ImageConfig.decoder``, ``ImageConfig.resample``; docs/FORMAT.md):
   by default a YCbCr/RGB or grey JPEG is decoded by libjpeg-turbo through simplejpeg
   (:mod:`h5forge.preprocess.jpeg`, the same DCT scaling) and every image is resized by
   torch's antialiased bilinear, the same filter and geometry in the file's orientation
   before the transposition (:mod:`h5forge.preprocess.resample`): Pillow's pixels within
   rounding, at 1.4-1.5x the Pillow path's rate on one core. Other files, and JPEGs
   simplejpeg refuses, are decoded by Pillow, per image. ``decoder="pillow"`` with
   ``resample="pillow"`` is the Pillow path above, pixel for pixel.

Errors are Pillow's and the decoders' (see :func:`load_normalised`);
:func:`h5forge.preprocess.images.process_file` turns them into quarantine reasons.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from h5forge.preprocess import jpeg, resample
from h5forge.preprocess import normalise as norm
from h5forge.preprocess.config import ImageConfig
from h5forge.targets.geometry import Geometry

__all__ = ["as_image", "load_geometry", "load_normalised", "load_pixels"]


def load_normalised(src: bytes | str, cfg: ImageConfig, *, resize: bool = False) -> Image.Image:
    """Decode frame 0 of an image and apply the normalisation rules of this module.

    The image of :func:`load_geometry`, which says what was done to it.

    Args:
        src: the file's bytes, or a local path.
        cfg: the configuration (``mode``, ``max_image_pixels`` and, with ``resize``, the
            resize policy).
        resize: also apply ``cfg.resize``. Readers of stored ``"original"`` bytes leave it
            False; the pipeline sets it.

    Returns:
        A loaded image in ``cfg.mode``.

    Raises:
        OSError: unreadable file, truncated or corrupt data (``UnidentifiedImageError`` when the
            format is not recognised).
        PIL.Image.DecompressionBombError: more than ``cfg.max_image_pixels`` pixels.
        ValueError, SyntaxError, EOFError, struct.error: malformed data, from Pillow.
    """
    return load_geometry(src, cfg, resize=resize)[0]


def load_geometry(
    src: bytes | str, cfg: ImageConfig, *, resize: bool = False
) -> tuple[Image.Image, Geometry]:
    """:func:`load_normalised`, and the :class:`Geometry` it applied: the file's size before
    EXIF, its orientation and the resize plan (None without ``resize``). Same errors."""
    pixels, geometry = load_pixels(src, cfg, resize=resize)
    return (pixels if isinstance(pixels, Image.Image) else as_image(pixels)), geometry


def as_image(arr: np.ndarray) -> Image.Image:
    """An ``(H, W, C)`` uint8 array (any strides) as a Pillow image, ``RGB`` or ``L``."""
    arr = np.ascontiguousarray(arr)
    return Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)


def load_pixels(
    src: bytes | str, cfg: ImageConfig, *, resize: bool = False
) -> tuple[Image.Image | np.ndarray, Geometry]:
    """:func:`load_geometry` without the final copy into a Pillow image: an ``(H, W, C)``
    uint8 array (possibly a strided view) on the array path, an image on the Pillow path
    (``decoder="pillow", resample="pillow"``). Same errors.

    Both paths read the header with Pillow first (format, size, EXIF), and refuse more than
    ``cfg.max_image_pixels`` pixels before any pixel is decoded. On the array path a JPEG that
    :mod:`h5forge.preprocess.jpeg` takes is decoded by it; everything else, and a JPEG whose
    data it refuses, by Pillow (same DCT scaling, mode rules), per image.
    """
    if isinstance(src, str):
        with open(src, "rb") as f:
            src = f.read()
    img = norm.open_checked(src, cfg.max_image_pixels)
    orientation, file_size = norm.orientation(img), img.size
    plan = norm.plan(file_size, orientation, cfg) if resize else None
    geometry = Geometry(file_size, orientation, plan)
    if cfg.decoder == "pillow" and cfg.resample == "pillow":
        return _pillow_path(img, cfg, plan, orientation), geometry
    is_jpeg = isinstance(img, JpegImageFile)
    scale = norm.dct_scale(file_size, plan, orientation) if plan is not None and is_jpeg else 1
    arr = None
    if cfg.decoder == "simplejpeg" and jpeg.accepts(img):
        arr = jpeg.decode(src, file_size=file_size, scale=scale, mode=cfg.mode)
    if arr is None:  # Pillow decodes it: other formats, CMYK/YCCK, data simplejpeg refused
        if scale > 1:  # the same DCT scaling, by the same rule
            assert plan is not None
            if img.draft(None, plan.size[::-1] if orientation >= 5 else plan.size) is None:
                scale = 1
            assert img.size == (-(-file_size[0] // scale), -(-file_size[1] // scale))
        img.load()
        arr = np.asarray(norm.normalise_mode(img, cfg.mode))
        if arr.ndim == 2:
            arr = arr[:, :, None]
    extent = (file_size[0] / scale, file_size[1] / scale)
    out = resample.resize_orient_crop(
        arr, plan=plan, orientation=orientation, extent=extent, kernel=cfg.resample
    )
    return out, geometry


def _pillow_path(
    img: Image.Image, cfg: ImageConfig, plan: norm.Plan | None, orientation: int
) -> Image.Image:
    """Pillow decodes, transposes, converts and resizes (the crop's box only)."""
    region = None
    if plan is not None and isinstance(img, JpegImageFile):
        region = norm.draft(img, plan, orientation)
    img.load()
    if orientation != 1:
        img = img.transpose(norm.TRANSPOSE[orientation])
    img = norm.normalise_mode(img, cfg.mode)
    if plan is not None:
        img = norm.apply(img, plan, region)
    return img
