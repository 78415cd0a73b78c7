"""The per-sample index of an asset: load it once, and refuse one a reader cannot use safely.

:func:`load_index` reads the header and the index arrays (byte ranges, labels, splits, shapes)
from an open file; :func:`check_index` and :func:`check_labels` refuse, before any sample is
read, an index that would turn into a huge allocation, a read at a nonsense offset or a label
outside the classes. docs/FORMAT.md ("What readers refuse") lists the refusals.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

from h5forge.asset import declared
from h5forge.asset import format as fmt
from h5forge.asset.open import H5_DAMAGE
from h5forge.errors import IntegrityError, StoreError

__all__ = ["AssetIndex", "check_index", "check_labels", "load_index", "repeated_paths"]


@dataclass(frozen=True)
class AssetIndex:
    """Everything a reader needs about an asset, loaded once per process.

    Attributes:
        header: parsed root attributes.
        byte_ranges: ``(N, 2) uint64`` absolute (offset, nbytes) of each sample's stored bytes.
        labels: ``(N,) int64``.
        split_codes: ``(N,) uint8`` index into ``split_names``.
        split_names: split names (``('',)`` when the source had none).
        classes: class names.
        image_shape: ``(H, W, C)`` for array storage, else ``None``.
        shapes: ``(N, 3)`` for blob storage, else ``None``.
        filtered: True when ``/images`` has HDF5 filters (compression, fletcher32), so stored
            bytes are not the sample bytes and reads must go through HDF5.
    """

    header: fmt.Header
    byte_ranges: np.ndarray
    labels: np.ndarray
    split_codes: np.ndarray
    split_names: tuple[str, ...]
    classes: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    shapes: np.ndarray | None
    filtered: bool


def _strings(ds: h5py.Dataset) -> tuple[str, ...]:
    return tuple(ds.asstr()[()].tolist()) if ds.shape and ds.shape[0] else ()


def load_index(h5: h5py.File, *, where: str, require_sealed: bool = True) -> AssetIndex:
    """Read the header and the per-sample index arrays from an open file.

    Raises:
        UnsealedFileError: unknown format, unknown version, or not sealed.
        IntegrityError: a required dataset is missing, or HDF5 cannot read the index.
    """
    try:
        return _load_index(h5, where=where, require_sealed=require_sealed)
    except (IntegrityError, FileNotFoundError, StoreError):  # a failed store is no damage
        raise
    except H5_DAMAGE as e:
        raise IntegrityError(
            f"{where} cannot be read: its HDF5 structure is damaged ({type(e).__name__}: {e}); "
            "re-fetch or re-pack it"
        ) from e


def check_labels(index: AssetIndex, *, where: str) -> None:
    """Refuse labels outside ``0..K-1`` (``K`` the number of class names) and split codes
    outside the split names: what a reader hands out, and what counts are indexed by.

    Raises:
        IntegrityError: naming the first bad value and its row.
    """
    k, labels = len(index.classes), index.labels
    if index.header.num_classes != k:
        raise IntegrityError(
            f"{where}: /classes has {k} names, root attribute num_classes "
            f"says {index.header.num_classes}; the file is damaged — run "
            "`h5forge verify`"
        )
    bad = np.flatnonzero((labels < 0) | (labels >= k))
    if len(bad):
        i = int(bad[0])
        raise IntegrityError(
            f"{where}: label {int(labels[i])} out of range: file declares {k} "
            f"classes (0..{k - 1}) in /labels[{i}] ({len(bad)} bad label(s)); "
            "the file is damaged — run `h5forge verify`"
        )
    s = len(index.split_names)
    bad = np.flatnonzero(index.split_codes >= s)
    if len(bad):
        i = int(bad[0])
        raise IntegrityError(
            f"{where}: split code {int(index.split_codes[i])} out of range "
            f"0..{s - 1} in /splits[{i}]; the file is damaged — run "
            "`h5forge verify`"
        )


def repeated_paths(paths: list[str]) -> list[str]:
    """One line per ``/paths`` row that repeats an earlier row's path (the first 100).

    A sample's path is its identity (docs/FORMAT.md: ``diff`` matches samples by it and an
    incremental build reuses by it), and discovery never lists one path twice, so a file that
    does is not one h5forge wrote: ``verify`` and ``diff`` both refuse it.
    """
    first: dict[str, int] = {}
    lines: list[str] = []
    for row, path in enumerate(paths):
        seen = first.setdefault(path, row)
        if seen != row and len(lines) < 100:
            lines.append(f"/paths[{row}] repeats the path of /paths[{seen}]: {path!r:.200}")
    return lines


def check_index(
    index: AssetIndex, file_size: int, *, where: str, max_pixels: int | None = None
) -> None:
    """Refuse an index a reader cannot use safely, before any sample is read.

    Refused: rows missing; a label or split code out of range (:func:`check_labels`); a byte
    range past the end of the file, overlapping another, or (unfiltered storage of decoded
    pixels) not one sample's size; a ``/shapes`` row of the wrong channel count; and, with
    ``max_pixels``, a sample whose decoded size is more than ``max_pixels`` pixels where that
    size is not bounded by the file's (encoded samples, and compressed ``array`` chunks).

    Cheap (vectorised, at open); it keeps a damaged or hostile index from turning into a huge
    allocation or a read at a nonsense offset. It does not prove the data right: that is
    ``verify``.

    Raises:
        IntegrityError: naming the first bad sample.
    """
    hdr = index.header
    n, r = hdr.num_samples, index.byte_ranges
    wanted = {
        "byte_ranges": (r, (n, 2)),
        "labels": (index.labels, (n,)),
        "splits": (index.split_codes, (n,)),
    }
    if index.shapes is not None:
        wanted["shapes"] = (index.shapes, (n, 3))
    for name, (arr, shape) in wanted.items():
        if arr.shape != shape:
            raise IntegrityError(
                f"{where}: /{name} has shape {arr.shape}, num_samples is {n}; "
                "the file is damaged — run `h5forge verify`"
            )
    check_labels(index, where=where)
    size = np.uint64(max(file_size, 0))
    bad = (r[:, 1] > size) | (r[:, 0] > size - np.minimum(r[:, 1], size))
    if index.image_shape is not None and not index.filtered:
        bad |= r[:, 1] != np.uint64(np.prod(index.image_shape))
    if index.shapes is not None:
        _check_shapes(index, int(size), where, max_pixels)
        if hdr.layout == "decoded":
            # No overflow: H*W <= file size (checked above) and C <= 3.
            bad |= r[:, 1] != np.prod(index.shapes.astype(np.uint64), axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise IntegrityError(
            f"{where}: /byte_ranges[{i}] = {tuple(int(x) for x in r[i])} does "
            f"not fit a sample of this {file_size}-byte file; the file is "
            "damaged — run `h5forge verify`"
        )
    _check_overlap(r, where)
    if (
        max_pixels is not None
        and index.image_shape is not None
        and index.filtered
        and index.image_shape[0] * index.image_shape[1] > max_pixels
    ):
        h, w, _ = index.image_shape
        raise IntegrityError(
            f"{where}: /images holds compressed samples of {h} x {w} = "
            f"{h * w} pixels, more than max_pixels={max_pixels}; pass a larger "
            "max_pixels if you trust this file"
        )


def _check_shapes(index: AssetIndex, size: int, where: str, max_pixels: int | None) -> None:
    """``/shapes`` rows: the file's channel count, at least 1 x 1, and a bounded pixel count
    (computed so that no product can overflow: each factor is below 2**32)."""
    assert index.shapes is not None
    shapes = index.shapes.astype(np.uint64)
    hw = shapes[:, 0] * shapes[:, 1]  # < 2**64: both factors are uint32
    channels = index.header.channels
    decoded = index.header.layout == "decoded"
    limit = size if decoded else (max_pixels if max_pixels is not None else None)
    bad = (shapes[:, 2] != channels) | (hw == 0)
    if limit is not None:
        bad |= hw > np.uint64(limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        h, w, c = (int(x) for x in index.shapes[i])
        if c != channels or h * w == 0:
            why = f"expected (H >= 1, W >= 1, {channels}) for mode {index.header.mode}"
        elif decoded:
            why = f"more pixels than the whole {size}-byte file holds"
        else:
            why = (
                f"{h * w} pixels, more than max_pixels={max_pixels}; pass a larger "
                "max_pixels if you trust this file"
            )
        raise IntegrityError(f"{where}: /shapes[{i}] = ({h}, {w}, {c}): {why}")


def _check_overlap(r: np.ndarray, where: str) -> None:
    """No two samples may share stored bytes (the writer's are in order: one O(N) pass)."""
    if len(r) < 2:
        return
    starts, ends = r[:, 0], r[:, 0] + r[:, 1]  # no overflow: each range lies in the file
    if not np.all(starts[1:] >= starts[:-1]):
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    else:
        order = None
    clash = np.flatnonzero(starts[1:] < ends[:-1])
    if len(clash):
        a, b = int(clash[0]), int(clash[0]) + 1
        if order is not None:
            a, b = int(order[a]), int(order[b])
        raise IntegrityError(
            f"{where}: /byte_ranges[{b}] = {tuple(int(x) for x in r[b])} "
            f"overlaps /byte_ranges[{a}] = {tuple(int(x) for x in r[a])}; "
            "the file is damaged — run `h5forge verify`"
        )


def _load_index(h5: h5py.File, *, where: str, require_sealed: bool) -> AssetIndex:
    header = fmt.read_header(h5.attrs, where=where)
    if require_sealed:
        fmt.require_sealed(header, where=where)
    missing = [n for n in fmt.REQUIRED_DATASETS[header.storage] if n not in h5]
    if missing:
        raise IntegrityError(f"{where} lacks required datasets {missing}; the file is damaged")
    # Declared shapes and types against the counts and the file size, before reading any.
    declared.check_declared(h5, header, file_size=h5.id.get_filesize(), where=where)
    images = h5[fmt.IMAGES]
    filtered = images.id.get_create_plist().get_nfilters() > 0
    return AssetIndex(
        header=header,
        byte_ranges=h5[fmt.BYTE_RANGES][()],
        labels=h5[fmt.LABELS][()],
        split_codes=h5[fmt.SPLITS][()],
        split_names=_strings(h5[fmt.SPLIT_NAMES]),
        classes=_strings(h5[fmt.CLASSES]),
        image_shape=tuple(int(x) for x in images.shape[1:]) if header.storage == "array" else None,  # type: ignore[arg-type]
        shapes=h5[fmt.SHAPES][()] if header.storage == "blob" else None,
        filtered=filtered,
    )
