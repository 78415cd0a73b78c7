"""The ``"simplejpeg"`` decoder: libjpeg-turbo through simplejpeg, for the JPEGs it decodes as
Pillow would.

simplejpeg is a thin binding of libjpeg-turbo's TurboJPEG API (wheels for Linux, macOS and
Windows). It decodes straight into a numpy array, where Pillow decodes into its own 4-byte
pixel storage first: 1.4-1.7x Pillow's decode rate on photos, one core. The settings are fixed, so
that the name alone says what the pixels are: the accurate integer DCT and smooth ("fancy")
chroma upsampling, Pillow's defaults, and DCT scaling by the rule of
:func:`~h5forge.preprocess.normalise.dct_scale` (1/2, 1/4 or 1/8, only at two or more times
the resize). The fast DCT and upsampling were measured at +4-6% rate for a mean PSNR of
44-55 dB (worst image 39-41 dB) against today's pixels (benchmarks/RESULTS.md), so they are
not used.

A JPEG this decoder does not take, or whose data it refuses, is decoded by Pillow instead
(:func:`h5forge.preprocess.decode.load_pixels`), so its pixels, or its quarantine reason,
are Pillow's: CMYK and YCCK (Pillow's colour conversion), and anything libjpeg-turbo reports
as an error or a warning (a truncated or corrupt file, extraneous bytes between markers).
"""

from __future__ import annotations

import numpy as np
import simplejpeg
from PIL import Image

__all__ = ["accepts", "decode"]


def accepts(img: Image.Image) -> bool:
    """Whether ``img`` (opened, header only) is a JPEG that simplejpeg decodes as Pillow
    does: YCbCr or RGB (Pillow's ``"RGB"``) and greyscale (``"L"``)."""
    return img.format == "JPEG" and img.mode in ("RGB", "L")


def decode(raw: bytes, *, file_size: tuple[int, int], scale: int, mode: str) -> np.ndarray | None:
    """Decode ``raw`` at ``1/scale`` into an ``(h, w, C)`` uint8 array in file orientation.

    Args:
        raw: the JPEG file's bytes (its header already checked by Pillow, size bounded).
        file_size: ``(W, H)`` from the header.
        scale: the DCT scaling denominator, 1, 2, 4 or 8.
        mode: ``"RGB"`` (a grey JPEG's value in every channel, as Pillow converts it) or
            ``"L"`` (the JPEG's luma; a colour JPEG's Y, which Pillow's ``convert("L")``
            recomputes from RGB to within rounding).

    Returns:
        ``ceil(H / scale) x ceil(W / scale) x C`` pixels, or None where libjpeg-turbo refuses
        the data or gives another size: the caller decodes the file with Pillow instead.
    """
    w, h = -(-file_size[0] // scale), -(-file_size[1] // scale)
    try:
        arr = simplejpeg.decode_jpeg(
            raw, "GRAY" if mode == "L" else "RGB", min_width=w, min_height=h, strict=True
        )
    except ValueError:  # libjpeg-turbo's errors and, strict, its warnings
        return None
    channels = 1 if mode == "L" else 3
    if arr.shape != (h, w, channels):
        return None
    return arr
