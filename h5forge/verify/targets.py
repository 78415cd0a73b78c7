"""Verify the target columns of a format version 2 file: every chosen sample's bytes in every
column against its digest, and what the bytes hold against the column's rules.

The layout (datasets, types, offsets, mask shapes) was checked at open
(:mod:`h5forge.asset.target_layout`). Here each column's ``values`` are read in blocks of at
most 64 MiB, each sample's stored bytes hashed and compared with ``digests``, then checked:
multilabel indices sorted, distinct and in range; box rows finite, ``x1 <= x2``, ``y1 <= y2``
inside the image, class in range, iscrowd 0 or 1; a PNG mask decodes (at most ``max_pixels``)
to its recorded shape; text is UTF-8 without NUL; a number is finite. Failures are collected,
one line each, like the rest of :func:`h5forge.verify.checks.verify`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.target_layout import file_schema, image_sizes
from h5forge.targets.rules import bad_boxes, bad_labels
from h5forge.targets.schema import Column, TargetError
from h5forge.targets.store import load_mask

__all__ = ["check_targets"]

_BLOCK = 64 << 20
_MAX_FAILS = 100  # per column: a damaged column is not listed sample by sample


def check_targets(
    h5: h5py.File,
    header: fmt.Header,
    chosen: Sequence[int],
    fails: list[str],
    *,
    decode: bool,
    max_pixels: int,
) -> None:
    """Append a line to ``fails`` for every chosen sample whose target bytes do not match
    their digest or break their column's rule; ``decode=False`` skips decoding PNG masks."""
    schema = file_schema(header, where="")
    if not schema or not chosen:
        return
    sizes = image_sizes(h5, header)
    for c in schema:
        col = h5[f"{fmt.TARGETS}/{c.name}"]
        values, digests = col["values"], col["digests"][()]
        if c.kind == "number":
            offsets = np.arange(header.num_samples + 1, dtype=np.int64)
        else:
            offsets = col["offsets"][()].astype(np.int64)
        shapes = col["shapes"][()] if c.kind == "mask" else None
        row = values.dtype.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
        before = len(fails)
        for block in _blocks(chosen, offsets, row):
            a, b = int(offsets[block[0]]), int(offsets[block[-1] + 1])
            data = values[a:b].tobytes()
            for i in block:
                if len(fails) - before >= _MAX_FAILS:
                    break
                blob = data[(int(offsets[i]) - a) * row : (int(offsets[i + 1]) - a) * row]
                where = f"/{fmt.TARGETS}/{c.name} sample {i}"
                if hashlib.sha256(blob).digest() != digests[i].tobytes():
                    fails.append(
                        f"{where}: sha256 {hashlib.sha256(blob).hexdigest()} does not match "
                        f"its digest {digests[i].tobytes().hex()}"
                    )
                    continue
                shape = None if shapes is None else shapes[i]
                problem = _problem(c, blob, shape, sizes[i], decode, max_pixels)
                if problem:
                    fails.append(f"{where}: {problem}")


def _blocks(chosen: Sequence[int], offsets: np.ndarray, row: int) -> list[list[int]]:
    """Runs of consecutive chosen samples whose values span at most ``_BLOCK`` bytes."""
    out: list[list[int]] = []
    for i in chosen:
        if out and out[-1][-1] == i - 1:
            span = (int(offsets[i + 1]) - int(offsets[out[-1][0]])) * row
            if span <= _BLOCK:
                out[-1].append(i)
                continue
        out.append([i])
    return out


def _problem(
    c: Column,
    blob: bytes,
    shape: np.ndarray | None,
    size: np.ndarray,
    decode: bool,
    max_pixels: int,
) -> str:
    """What is wrong with one sample's (digest-checked) bytes, or ``""``."""
    if c.kind == "multilabel":
        v = np.frombuffer(blob, "<i4")
        if len(v) and (bad_labels(v, len(c.classes)).any() or (np.diff(v) <= 0).any()):
            return (
                f"class indices {v.tolist()[:10]} not sorted, distinct, in 0..{len(c.classes) - 1}"
            )
    elif c.kind == "boxes":
        b = np.frombuffer(blob, "<f4").reshape(-1, 6)
        h, w = int(size[0]), int(size[1])
        bad = bad_boxes(b, len(c.classes), (h, w))
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            return (
                f"box {j} {b[j].tolist()} is not finite XYXY inside the {w} x {h} image with a "
                f"class in 0..{len(c.classes) - 1} and iscrowd 0 or 1"
            )
    elif c.kind == "mask" and c.encoding == "png" and decode:
        assert shape is not None
        try:
            got = np.asarray(load_mask(blob, max_pixels)).shape
        except TargetError as e:
            return str(e).removeprefix("bad target: ")
        if got != tuple(int(x) for x in shape):
            return f"mask decodes to {got}, recorded {tuple(int(x) for x in shape)}"
    elif c.kind == "text":
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"text is not UTF-8: {e}"
        if "\x00" in text:
            return "text holds a NUL character"
    elif c.kind == "number" and c.dtype == "float64":
        value = float(np.frombuffer(blob, "<f8")[0])
        if not np.isfinite(value):
            return f"number {value!r} is not finite"
    return ""
