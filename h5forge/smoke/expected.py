"""What a smoke-load expects of each sample, and every way a sample read back differs from it.

:func:`read_expected` reads, once in the main process, what the file declares (its checked
index, ``/digests``, and the stored bytes of encoded samples); :func:`check_sample` compares one
sample a DataLoader worker handed over with it: dtype ``uint8``, C x H x W shape, label (and its
range) and the sha256 in ``/digests`` (of the pixels, or of the encoded bytes, whose decoding
must then equal the worker's pixels).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import torch

from h5forge.asset import format as fmt
from h5forge.asset.index import AssetIndex, load_index
from h5forge.asset.open import open_h5
from h5forge.location import Location

__all__ = ["Expected", "check_sample", "read_expected"]


@dataclass(frozen=True)
class Expected:
    """What the file says about itself, read once in the main process."""

    index: AssetIndex
    digests: np.ndarray
    raw: dict[int, bytes]  # encoded layout: stored bytes of each checked sample


def read_expected(where: Location, indices: set[int]) -> Expected:
    url = where.url
    with open_h5(where) as h5:
        # Sealed, and declared sizes checked against the counts before the index is read.
        index = load_index(h5, where=url)
        raw: dict[int, bytes] = {}
        if index.header.layout == "encoded":
            images, offsets = h5[fmt.IMAGES], h5[fmt.OFFSETS]
            for i in sorted(indices):
                lo, hi = (int(x) for x in offsets[i : i + 2])
                raw[i] = images[lo:hi].tobytes()
        return Expected(index=index, digests=h5[fmt.DIGESTS][()], raw=raw)


def check_sample(
    exp: Expected, index: int, image: object, label: object, url: str, *, max_pixels: int
) -> list[str]:
    """Every way sample ``index`` read through the DataLoader differs from the file; an encoded
    sample is decoded again with the reader's own bound ``max_pixels``."""
    where, idx = f"{url}[{index}]", exp.index
    k = len(idx.classes)
    if not isinstance(image, torch.Tensor):
        return [f"{where}: got {type(image).__name__}, expected a torch.Tensor"]
    problems: list[str] = []
    if image.dtype != torch.uint8:
        problems.append(f"{where}: dtype {image.dtype}, expected torch.uint8")
    want_hwc = idx.image_shape if idx.shapes is None else tuple(int(x) for x in idx.shapes[index])
    want_chw = (want_hwc[2], want_hwc[0], want_hwc[1]) if want_hwc else None
    if image.ndim != 3 or tuple(image.shape) != want_chw:
        problems.append(f"{where}: shape {tuple(image.shape)}, expected C x H x W = {want_chw}")
    if not isinstance(label, int) or not 0 <= label < k:
        problems.append(
            f"{where}: label {label!r} out of range: file declares {k} classes (0..{k - 1})"
        )
    elif label != int(idx.labels[index]):
        problems.append(f"{where}: label {label}, /labels[{index}] is {int(idx.labels[index])}")
    if problems:
        return problems
    hwc = image.permute(1, 2, 0).contiguous().numpy()
    expected = bytes(exp.digests[index]).hex()
    if idx.header.layout == "encoded":
        # The digest covers the encoded file bytes: check them, then check that the worker's
        # decoded pixels are exactly what decoding those bytes gives.
        from h5forge.preprocess.images import Encoding, decode_stored

        raw = exp.raw[index]
        actual = hashlib.sha256(raw).hexdigest()
        if actual != expected:
            return [f"{where}: sha256 of stored bytes {actual}, /digests says {expected}"]
        ref = decode_stored(
            raw,
            want_hwc,
            layout="encoded",
            encoding=cast(Encoding, idx.header.encoding),
            mode=cast(Literal["RGB", "L"], idx.header.mode),
            max_pixels=max_pixels,
        )
        if ref.shape != hwc.shape or not np.array_equal(ref, hwc):
            return [f"{where}: decoded pixels differ from decoding the stored bytes"]
        return []
    actual = hashlib.sha256(hwc.tobytes()).hexdigest()
    if actual != expected:
        return [f"{where}: sha256 of pixels read {actual}, /digests says {expected}"]
    return []
