"""One sample's targets as the file stores them, and the ``/targets`` columns written and read.

Per column ``NAME`` (docs/FORMAT.md, format version 2), under ``/targets/NAME``:

* ``values``: every sample's stored rows back to back, contiguous: ``(M,) int32`` class
  indices (multilabel), ``(M, 6) float32`` boxes ``x1, y1, x2, y2, class, iscrowd`` (boxes),
  ``(B,) uint8`` bytes (mask: raw ``H*W`` pixels or a PNG file; text: UTF-8), or
  ``(N,) int64 | float64`` (number: one row per sample);
* ``offsets``: ``(N + 1,) uint64``, sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``
  (in rows; not for number columns);
* ``shapes``: ``(N, 2) uint32`` ``(H, W)`` of each mask (mask only);
* ``digests``: ``(N, 32) uint8``, sha256 of each sample's stored bytes in this column.

So each sample's value in each column is one contiguous byte range of the file
(:meth:`h5forge.targets.columns.Columns.ranges`), and every stored target byte is covered by
a per-sample digest.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import h5py
import numpy as np
from PIL import Image

from h5forge.preprocess import normalise as norm
from h5forge.targets.drawn import draw
from h5forge.targets.geometry import Geometry, check_mask_size, move_boxes, move_mask
from h5forge.targets.schema import Column, TargetError
from h5forge.targets.shapes import Drawn

__all__ = [
    "GROUP",
    "StoredTargets",
    "TargetSink",
    "decode_value",
    "encode_targets",
    "load_mask",
]

GROUP = "targets"
_ROW: dict[str, tuple[Any, tuple[int, ...]]] = {  # kind -> values dtype, row shape
    "multilabel": (np.int32, ()),
    "boxes": (np.float32, (6,)),
    "mask": (np.uint8, ()),
    "text": (np.uint8, ()),
}
_COPY = 64 << 20


@dataclass(frozen=True)
class StoredTargets:
    """One sample's targets, ready to store: per column (schema order) its bytes and, for a
    mask, its ``(H, W)`` and the count of its pixels per class id (256 ints, for the build
    report, made where the mask was decoded); ``dropped``: boxes that lost all area to the
    crop."""

    data: tuple[bytes, ...]
    shapes: tuple[tuple[int, int] | None, ...]
    dropped: int = 0
    histograms: tuple[np.ndarray | None, ...] = ()


def load_mask(raw: bytes, max_pixels: int) -> Image.Image:
    """Open a mask image: one channel of class ids (``L``, ``P`` palette indices, ``1``, or
    16/32-bit grey whose values are all <= 255).

    Raises:
        TargetError: unreadable, too large, or not one channel of values 0..255.
    """
    try:
        img = norm.open_checked(raw, max_pixels)
        img.load()
    except Image.DecompressionBombError as e:
        raise TargetError(f"bad target: mask too large: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise TargetError(f"bad target: mask does not decode: {e}") from None
    if img.mode in ("L", "P"):
        return img
    if img.mode == "1":
        return Image.fromarray(np.asarray(img, np.uint8))
    if img.mode.startswith("I"):
        arr = np.asarray(img)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise TargetError(
                f"bad target: mask values {int(arr.min())}..{int(arr.max())}; class ids "
                "must be 0..255"
            )
        return Image.fromarray(arr.astype(np.uint8))
    raise TargetError(
        f"bad target: mask is {img.mode}, not one channel of class ids (L or P); convert it "
        "to a single-channel PNG"
    )


def _mask_image(
    v: object, g: Geometry, read: Callable[[str], bytes], max_pixels: int
) -> Image.Image:
    """A mask column's raw value as an image: drawn (its size checked first: drawing costs
    what the size says), or a mask file read and opened."""
    if isinstance(v, Drawn):
        check_mask_size(v.size, g)
        return draw(v, max_pixels)
    try:
        raw = read(str(v))
    except OSError as e:
        raise TargetError(f"bad target: mask unreadable: {e.strerror or e}") from None
    return load_mask(raw, max_pixels)


def encode_targets(
    schema: Sequence[Column],
    values: Mapping[str, object],
    g: Geometry,
    *,
    read: Callable[[str], bytes],
    max_pixels: int,
) -> StoredTargets:
    """Turn one sample's raw, checked values into what each column stores, after ``g``.

    Args:
        schema: the columns (``encoding`` of a mask column set: ``raw`` or ``png``).
        values: column name -> raw value (:func:`h5forge.targets.schema.check_value`).
        g: what was done to the image.
        read: reads a mask file's bytes (local path); a :class:`~h5forge.targets.drawn.Drawn`
            mask is drawn instead.
        max_pixels: most pixels a mask may have.

    Raises:
        TargetError: a mask cannot be read, is of another size than the image, or is not one
            channel of class ids; a value is missing.
    """
    data: list[bytes] = []
    shapes: list[tuple[int, int] | None] = []
    histograms: list[np.ndarray | None] = []
    dropped = 0
    for c in schema:
        if c.name not in values:
            raise TargetError(f"bad target: column {c.name!r} has no value")
        v = values[c.name]
        shape, hist = None, None
        if c.kind == "multilabel":
            blob = np.asarray(v, np.int32).tobytes()
        elif c.kind == "boxes":
            moved = move_boxes(v, g)
            blob, dropped = moved.boxes.tobytes(), dropped + moved.dropped
        elif c.kind == "mask":
            try:
                arr = move_mask(_mask_image(v, g, read, max_pixels), g)
            except TargetError:
                raise
            except ValueError as e:  # a mask of another size
                raise TargetError(f"bad target: {e}") from None
            shape = (int(arr.shape[0]), int(arr.shape[1]))
            hist = np.bincount(arr.ravel(), minlength=256)
            if c.encoding == "png":
                buf = io.BytesIO()
                Image.fromarray(arr).save(buf, format="PNG")
                blob = buf.getvalue()
            else:
                blob = arr.tobytes()
        elif c.kind == "text":
            blob = str(v).encode("utf-8")
        else:
            blob = np.asarray([v], np.dtype(c.dtype)).tobytes()
        data.append(blob)
        shapes.append(shape)
        histograms.append(hist)
    return StoredTargets(tuple(data), tuple(shapes), dropped, tuple(histograms))


def decode_value(c: Column, data: bytes | memoryview, shape: Sequence[int] | None) -> Any:
    """One stored value back: multilabel ``(k,) int64``; boxes ``(M, 6) float32``; mask
    ``(H, W) uint8``; text ``str``; number ``int`` or ``float``.

    Raises:
        ValueError: the bytes do not fit the column (a damaged file).
    """
    if c.kind == "multilabel":
        return np.frombuffer(data, np.int32).astype(np.int64)
    if c.kind == "boxes":
        return np.frombuffer(data, np.float32).reshape(-1, 6).copy()
    if c.kind == "text":
        return bytes(data).decode("utf-8")
    if c.kind == "number":
        value = np.frombuffer(data, np.dtype(c.dtype))
        return value[0].item()
    assert shape is not None, "a mask has a shape"
    h, w = int(shape[0]), int(shape[1])
    if c.encoding == "png":
        arr = np.asarray(load_mask(bytes(data), max(1, h * w)))
    else:
        arr = np.frombuffer(data, np.uint8)
        if arr.size != h * w:
            raise ValueError(f"mask holds {arr.size} bytes, shape {h} x {w} needs {h * w}")
        arr = arr.reshape(h, w)
    if arr.shape != (h, w):
        raise ValueError(f"mask decodes to {arr.shape}, expected {(h, w)}")
    return arr.copy()


class TargetSink:
    """Collects every packed sample's :class:`StoredTargets` in order, and writes
    ``/targets`` at the end.

    Args:
        schema: the columns.
        spool: opens a spool file for one column's bytes (the pack creates it exclusively
            through its output lock); default: memory.
    """

    def __init__(
        self, schema: Sequence[Column], spool: Callable[[str], IO[bytes]] | None = None
    ) -> None:
        self.schema = tuple(schema)
        self._spools = [(spool or (lambda _name: io.BytesIO()))(c.name) for c in self.schema]
        self._lengths: list[list[int]] = [[] for _ in self.schema]
        self._shapes: list[list[tuple[int, int]]] = [[] for _ in self.schema]
        self._digests: list[list[bytes]] = [[] for _ in self.schema]
        self.dropped = 0

    def add(self, t: StoredTargets) -> None:
        """Append one sample (the next in order)."""
        for k, (blob, shape) in enumerate(zip(t.data, t.shapes, strict=True)):
            self._spools[k].write(blob)
            self._lengths[k].append(len(blob))
            self._digests[k].append(hashlib.sha256(blob).digest())
            if shape is not None:
                self._shapes[k].append(shape)
        self.dropped += t.dropped

    def close(self) -> None:
        """Close the spools."""
        for f in self._spools:
            f.close()

    def write(self, h5: h5py.File) -> None:
        """Create ``/targets/NAME/*`` for every column (after the images)."""
        group = h5.create_group(GROUP)
        for k, c in enumerate(self.schema):
            g = group.create_group(c.name)
            lengths = np.asarray(self._lengths[k], np.uint64)
            n = len(lengths)
            g.create_dataset("digests", data=_digests(self._digests[k], n))
            if c.kind == "number":
                values = np.frombuffer(_read_all(self._spools[k]), np.dtype(c.dtype))
                g.create_dataset("values", data=values)
                continue
            dtype, row = _ROW[c.kind]
            itemsize = np.dtype(dtype).itemsize * int(np.prod(row, dtype=np.int64))
            offsets = np.zeros(n + 1, np.uint64)
            np.cumsum(lengths // np.uint64(itemsize), out=offsets[1:])
            g.create_dataset("offsets", data=offsets)
            if c.kind == "mask":
                g.create_dataset(
                    "shapes", data=np.asarray(self._shapes[k], np.uint32).reshape(n, 2)
                )
            values = g.create_dataset("values", shape=(int(offsets[-1]), *row), dtype=dtype)
            _copy_spool(self._spools[k], values, itemsize)


def _digests(digests: list[bytes], n: int) -> np.ndarray:
    return np.frombuffer(b"".join(digests), np.uint8).reshape(n, 32)


def _read_all(f: IO[bytes]) -> bytes:
    f.flush()
    f.seek(0)
    return f.read()


def _copy_spool(f: IO[bytes], values: h5py.Dataset, itemsize: int) -> None:
    f.flush()
    f.seek(0)
    rows = max(1, _COPY // itemsize)
    at = 0
    while at < values.shape[0]:
        blob = f.read(rows * itemsize)
        k = len(blob) // itemsize
        assert k, "the spool holds every row"
        values[at : at + k] = np.frombuffer(blob, values.dtype).reshape(k, *values.shape[1:])
        at += k
