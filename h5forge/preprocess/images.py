"""Decode, normalise, resize and store one image; quarantine what cannot be decoded.

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

Quarantine reasons start with a kind: ``zero-byte file``, ``unreadable: ...`` (the file could
not be read), ``not an image: ...``, ``image too large: W x H = N pixels > limit M``,
``truncated image: ...``, ``corrupt image: ...`` (other decoder errors) and
``unsupported image: ...`` (a mode Pillow cannot convert). ``ImageFile.LOAD_TRUNCATED_IMAGES``
is left False: a truncated file is never padded with grey.

A sample's targets (:mod:`h5forge.targets`) are encoded next to its image, with the
:class:`~h5forge.targets.geometry.Geometry` it went through; a bad one quarantines the sample.
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from PIL import Image, UnidentifiedImageError
from PIL.JpegImagePlugin import JpegImageFile

from h5forge.errors import IntegrityError
from h5forge.options import Encoding, Layout, option
from h5forge.preprocess import jpeg, resample
from h5forge.preprocess import normalise as norm
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS, ImageConfig
from h5forge.targets.geometry import Geometry

if TYPE_CHECKING:
    from h5forge.targets.schema import Column
    from h5forge.targets.store import StoredTargets

__all__ = [
    "Encoding",
    "Layout",
    "Processed",
    "Quarantined",
    "decode_stored",
    "load_geometry",
    "load_normalised",
    "load_pixels",
    "process_file",
]

_PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


@dataclass(frozen=True)
class Processed:
    """One successfully processed input.

    Attributes:
        index: position of the input in the sequence given to the pipeline.
        data: stored bytes: raw C-order ``(H, W, C)`` uint8 pixels, or encoded file bytes.
        shape: ``(H, W, C)`` of the decoded, normalised image (resized unless the encoding is
            ``"original"``).
        digest: ``sha256(data).digest()``.
        targets: the sample's stored target values (None without a schema).
    """

    index: int
    data: bytes
    shape: tuple[int, int, int]
    digest: bytes
    targets: StoredTargets | None = None


@dataclass(frozen=True)
class Quarantined:
    """One input left out, with a short reason that starts with its kind."""

    index: int
    path: str
    reason: str


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
    return (pixels if isinstance(pixels, Image.Image) else _as_image(pixels)), geometry


def _as_image(arr: np.ndarray) -> Image.Image:
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


def process_file(
    index: int,
    path: str,
    cfg: ImageConfig,
    schema: Sequence[Column] = (),
    targets: Sequence[object] = (),
) -> Processed | Quarantined:
    """Read, validate, normalise and encode one file for storage (runs in a worker process).

    Only programming errors escape; every decoding problem becomes a :class:`Quarantined`.

    Args:
        index: position of the file in the input sequence (returned as is).
        path: local path of the source file.
        cfg: the configuration.
        schema: the target columns (mask ``encoding`` set), ``()`` for none.
        targets: the sample's raw values, one per column of ``schema``.

    Returns:
        :class:`Processed` with the stored bytes, or :class:`Quarantined` with the reason.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        return Quarantined(index, path, f"unreadable: {e.strerror or e}")
    if not raw:
        return Quarantined(index, path, "zero-byte file")
    keep_source = cfg.layout == "encoded" and cfg.encoding == "original"
    try:
        pixels, geometry = load_pixels(raw, cfg, resize=not keep_source)
        if keep_source:
            data = raw
        elif cfg.layout == "decoded":
            data = pixels.tobytes()  # C-order (H, W, C) for RGB and L, one copy
        else:
            img = pixels if isinstance(pixels, Image.Image) else _as_image(pixels)
            buf = io.BytesIO()
            img.save(buf, format=_PIL_FORMAT[cfg.encoding], quality=cfg.quality)
            data = buf.getvalue()
    except UnidentifiedImageError:
        return Quarantined(index, path, f"not an image: unknown format, starts with {raw[:12]!r}")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        reason = str(e) if str(e).startswith("image too large") else f"image too large: {e}"
        return Quarantined(index, path, reason)
    except (OSError, EOFError) as e:
        kind = "truncated image" if _is_truncation(e) else "corrupt image"
        return Quarantined(index, path, f"{kind}: {e}")
    except (SyntaxError, struct.error, ValueError) as e:
        if isinstance(e, ValueError) and "conversion" in str(e):
            return Quarantined(index, path, f"unsupported image: {e}")
        return Quarantined(index, path, f"corrupt image: {e}")
    stored = None
    if schema:  # "original" bytes were not resized: the geometry is EXIF only, as read back
        from h5forge.targets.schema import TargetError, check_value
        from h5forge.targets.store import encode_targets

        try:  # checked again: a catalog built by hand is not one discover() checked
            values = {c.name: check_value(c, v) for c, v in zip(schema, targets, strict=True)}
            stored = encode_targets(
                schema, values, geometry, read=_read_bytes, max_pixels=cfg.max_image_pixels
            )
        except TargetError as e:
            return Quarantined(index, path, str(e))
    if isinstance(pixels, Image.Image):
        shape = (pixels.height, pixels.width, 3 if pixels.mode == "RGB" else 1)
    else:
        shape = (pixels.shape[0], pixels.shape[1], pixels.shape[2])
    return Processed(index, data, shape, hashlib.sha256(data).digest(), stored)


def _read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def decode_stored(
    data: bytes | memoryview,
    shape: tuple[int, ...] | None,
    *,
    layout: Layout,
    mode: Literal["RGB", "L"],
    encoding: Encoding = "original",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """Turn one stored sample back into pixels.

    Decoded samples are reshaped; encoded ones are decoded with :func:`load_normalised`
    (EXIF and mode rules, never resized again, so ``"original"`` bytes come back at source
    size and re-encoded ones at the stored size).

    Args:
        data: the stored bytes of one sample.
        shape: the recorded ``(H, W, C)``; ``None`` skips the shape check (encoded only).
        layout: the file's layout.
        mode: the file's mode.
        encoding: the file's encoding (every encoding decodes the same way).
        max_pixels: most pixels an encoded sample may decode to, the caller's limit (checked
            against ``shape`` and the image's own header before any pixel is allocated; the
            file's recorded shape never raises it). Decoded samples are bounded by their bytes.

    Returns:
        A writable C-contiguous ``(H, W, C)`` uint8 array.

    Raises:
        IntegrityError: the bytes do not decode, do not match ``shape``, or are (or say they
            are) more than ``max_pixels`` pixels.
        ValueError: an unknown ``layout``, ``encoding`` or ``mode``, or a bad ``max_pixels``.
    """
    option("layout").check(layout)
    option("encoding").check(encoding)
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 1:
        raise ValueError(
            f"max_pixels={max_pixels!r} must be an int >= 1; the default is {DEFAULT_MAX_PIXELS}"
        )
    if layout == "decoded":
        if shape is None or len(shape) != 3:
            raise ValueError(f"shape={shape!r}: decoded samples need (H, W, C)")
        arr = np.frombuffer(data, dtype=np.uint8)
        if arr.size != int(np.prod(shape)):
            raise IntegrityError(
                f"decoded sample holds {arr.size} bytes, shape {tuple(shape)} "
                f"needs {int(np.prod(shape))}"
            )
        arr = arr.reshape(shape)
        return arr if arr.flags.writeable else arr.copy()
    if shape is not None and len(shape) >= 2 and int(shape[0]) * int(shape[1]) > max_pixels:
        raise IntegrityError(
            f"encoded sample is recorded as {int(shape[0])} x {int(shape[1])} "
            f"= {int(shape[0]) * int(shape[1])} pixels, more than "
            f"max_pixels={max_pixels}; pass a larger max_pixels if you trust "
            "the file"
        )
    cfg = ImageConfig(
        mode=mode,
        resize="none",
        size=None,
        max_image_pixels=max_pixels,
        decoder="pillow",  # the reader's decode is unchanged by the pack's faster path
        resample="pillow",
    )
    try:
        arr = np.array(load_normalised(bytes(data), cfg), dtype=np.uint8)
    except Image.DecompressionBombError as e:
        raise IntegrityError(
            f"encoded sample is too large to decode: {e} "
            f"(max_pixels={max_pixels}); pass a larger max_pixels if you "
            "trust the file"
        ) from e
    except (OSError, EOFError, SyntaxError, struct.error, ValueError) as e:
        raise IntegrityError(f"encoded sample does not decode: {e}") from e
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise IntegrityError(
            f"encoded sample decodes to {tuple(arr.shape)}, expected {tuple(shape)}"
        )
    return arr


def _is_truncation(e: BaseException) -> bool:
    return isinstance(e, EOFError) or "truncated" in str(e).lower()
