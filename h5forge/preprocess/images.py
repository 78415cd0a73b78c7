"""Process one input for storage, quarantining what cannot be decoded, and turn a stored
sample back into pixels.

The decoding and normalisation rules are :mod:`h5forge.preprocess.decode`'s.

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

from h5forge.errors import IntegrityError
from h5forge.options import Encoding, Layout, option
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS, ImageConfig
from h5forge.preprocess.decode import as_image, load_geometry, load_normalised, load_pixels

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
            img = pixels if isinstance(pixels, Image.Image) else as_image(pixels)
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
