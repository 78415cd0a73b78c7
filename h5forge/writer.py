"""Pack a catalog of images into one sealed h5forge file (format v1).

The writer is the only process that touches the HDF5 file; preprocessing runs in a process
pool and streams results back in order (see :mod:`h5forge.preprocess`). The file is written as
``OUT.partial``, flushed and fsynced, verified, sealed (the ``sealed`` attribute is written
last), and only then renamed to ``OUT``: an interrupted pack never leaves a file named ``OUT``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5forge import format as fmt
from h5forge.catalog import Catalog, discover
from h5forge.errors import EmptyDatasetError, MissingExtraError, TooManyBadImagesError
from h5forge.images import ImageConfig, Processed, Quarantined
from h5forge.preprocess import iter_processed

__all__ = ["COMPRESSIONS", "PackResult", "pack"]

COMPRESSIONS = ("none", "gzip", "lzf", "blosc-lz4", "zstd")
_COPY_BLOCK = 16 << 20


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote.

    Attributes:
        path: the sealed file.
        counts: ``split -> class name -> number of samples`` ('' is the split of unsplit data).
        quarantined: ``(relative path, reason)`` of every input that was not packed.
        seconds: wall time of the whole pack, verification included.
    """

    path: str
    num_samples: int
    num_quarantined: int
    num_classes: int
    classes: tuple[str, ...]
    quarantined: tuple[tuple[str, str], ...]
    bytes: int
    seconds: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)


def _filter_kwargs(compression: str | None, level: int | None, fletcher32: bool) -> dict[str, Any]:
    name = compression or "none"
    if name not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r} is not supported; use one of {COMPRESSIONS}")
    kwargs: dict[str, Any] = {"fletcher32": True} if fletcher32 else {}
    if name == "none":
        if level is not None:
            raise ValueError(f"compression_level={level} given without a compression; "
                             "set compression='gzip' (or another codec) or drop the level")
        return kwargs
    if name == "gzip":
        lvl = 4 if level is None else level
        if not 0 <= lvl <= 9:
            raise ValueError(f"gzip compression_level {lvl} is out of range 0..9")
        return {**kwargs, "compression": "gzip", "compression_opts": lvl}
    if name == "lzf":
        if level is not None:
            raise ValueError("lzf takes no compression_level; drop it")
        return {**kwargs, "compression": "lzf"}
    try:
        import hdf5plugin
    except ImportError as e:
        raise MissingExtraError(
            f"compression {name!r} needs the optional package hdf5plugin: "
            "pip install 'h5forge[plugins]'"
        ) from e
    if name == "blosc-lz4":
        lvl = 5 if level is None else level
        if not 0 <= lvl <= 9:
            raise ValueError(f"blosc-lz4 compression_level {lvl} is out of range 0..9")
        return {**kwargs, **hdf5plugin.Blosc(cname="lz4", clevel=lvl,
                                             shuffle=hdf5plugin.Blosc.SHUFFLE)}
    lvl = 3 if level is None else level
    if not 1 <= lvl <= 22:
        raise ValueError(f"zstd compression_level {lvl} is out of range 1..22")
    return {**kwargs, **hdf5plugin.Zstd(clevel=lvl)}


def _utf8(s: str) -> str:
    """File names may hold undecodable bytes (surrogate escapes); store them visibly escaped."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _strings(h5: h5py.File, name: str, values: list[str]) -> None:
    h5.create_dataset(name, data=np.array([_utf8(v) for v in values], dtype=object),
                      dtype=h5py.string_dtype("utf-8"), shape=(len(values),))


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Progress:
    """A rich progress bar when asked for, plus the caller's callback."""

    def __init__(self, total: int, show: bool, callback: Callable[[int, int], None] | None):
        self.total, self.callback, self._bar, self._task = total, callback, None, None
        if show:
            from rich.progress import Progress

            self._bar = Progress(transient=False)
            self._bar.start()
            self._task = self._bar.add_task("pack", total=total)

    def advance(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done)  # type: ignore[arg-type]
        if self.callback is not None:
            self.callback(done, self.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Sink:
    """Receives processed samples in order and writes them to the open file."""

    def __init__(self, h5: h5py.File, image: ImageConfig, spool_path: str,
                 filters: dict[str, Any], total: int) -> None:
        self.h5 = h5
        self.storage: fmt.Storage = (
            "array" if image.layout == "decoded" and image.resize != "none" else "blob")
        self.digests: list[bytes] = []
        self.shapes: list[tuple[int, int, int]] = []
        self.lengths: list[int] = []
        self._spool = None
        self._direct = not filters
        if self.storage == "array":
            assert image.size is not None
            h, w = image.size
            shape = (h, w, 1 if image.mode == "L" else 3)
            self.images = h5.create_dataset(
                fmt.IMAGES, shape=(total, *shape), maxshape=(None, *shape), dtype=np.uint8,
                chunks=(1, *shape), **filters)
            self._shape = shape
        else:
            if filters:
                raise ValueError(
                    "compression and fletcher32 apply to the fixed-size decoded layout only; "
                    "blob storage (encoded, or resize='none') stays uncompressed so each sample "
                    "is one byte range — drop the compression options")
            self._spool = open(spool_path, "wb")  # noqa: SIM115 - closed in finish()

    def add(self, r: Processed) -> None:
        j = len(self.digests)
        if self.storage == "array":
            if tuple(r.shape) != self._shape:
                raise AssertionError(f"sample {r.index}: shape {r.shape} != {self._shape}")
            if self._direct:
                self.images.id.write_direct_chunk((j, 0, 0, 0), r.data)
            else:
                self.images[j] = np.frombuffer(r.data, np.uint8).reshape(self._shape)
        else:
            assert self._spool is not None
            self._spool.write(r.data)
        self.digests.append(r.digest)
        self.shapes.append(tuple(r.shape))  # type: ignore[arg-type]
        self.lengths.append(len(r.data))

    def finish(self, spool_path: str) -> np.ndarray:
        """Lay out the image bytes for good and return ``byte_ranges``."""
        n = len(self.digests)
        if self.storage == "array":
            self.images.resize(n, axis=0)
            ranges = np.zeros((n, 2), np.uint64)

            def record(info: Any) -> None:
                ranges[info.chunk_offset[0]] = (info.byte_offset, info.size)

            self.images.id.chunk_iter(record)
            return ranges
        assert self._spool is not None
        self._spool.close()
        offsets = np.zeros(n + 1, np.uint64)
        np.cumsum(np.asarray(self.lengths, np.uint64), out=offsets[1:])
        total = int(offsets[-1])
        images = self.h5.create_dataset(fmt.IMAGES, shape=(total,), dtype=np.uint8)
        with open(spool_path, "rb") as f:
            pos = 0
            while block := f.read(_COPY_BLOCK):
                images[pos:pos + len(block)] = np.frombuffer(block, np.uint8)
                pos += len(block)
        self.h5.create_dataset(fmt.OFFSETS, data=offsets)
        self.h5.create_dataset(fmt.SHAPES, data=np.asarray(self.shapes, np.uint32).reshape(n, 3))
        base = images.id.get_offset() or 0
        return np.stack([offsets[:-1] + np.uint64(base), np.diff(offsets)], axis=1)


def _collect(results: Iterator[Processed | Quarantined], catalog: Catalog, sink: _Sink,
             progress: _Progress) -> tuple[list[int], list[tuple[str, str]]]:
    kept: list[int] = []
    bad: list[tuple[str, str]] = []
    for done, r in enumerate(results, start=1):
        if isinstance(r, Quarantined):
            bad.append((catalog.samples[r.index].relpath, r.reason))
        else:
            sink.add(r)
            kept.append(r.index)
        progress.advance(done)
    return kept, bad


def pack(src: str | os.PathLike[str] | Catalog, out: str | os.PathLike[str], *,
         image: ImageConfig | None = None, compression: str | None = None,
         compression_level: int | None = None, fletcher32: bool = False,
         workers: int | None = None, max_bad_fraction: float = 0.01,
         manifest: str | os.PathLike[str] | None = None, source_url: str = "",
         source_sha256: str = "", progress: bool = False,
         on_progress: Callable[[int, int], None] | None = None,
         overwrite: bool = False) -> PackResult:
    """Pack an image folder, manifest or :class:`Catalog` into a sealed h5forge file.

    Args:
        src: dataset root (ImageFolder layout, or the folder a ``manifest`` is relative to), or
            a catalog from :func:`h5forge.catalog.discover`.
        out: path of the ``.h5`` file to write (local).
        image: decoding, resizing and storage options; defaults to decoded RGB 224x224.
        compression: ``none`` (default), ``gzip``, ``lzf``, ``blosc-lz4`` or ``zstd`` (the
            last two need ``hdf5plugin``); decoded fixed-size layout only.
        workers: preprocessing processes; default: CPU count.
        max_bad_fraction: fail when more than this fraction of inputs is quarantined.
        on_progress: called with ``(done, total)`` after each input.
        overwrite: replace an existing ``out``.

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        TooManyBadImagesError: too many inputs were quarantined (lists the first reasons).
        EmptyDatasetError: nothing usable, or a class lost all its images to quarantine.
    """
    t0 = time.perf_counter()
    image = image or ImageConfig()
    image.validate()
    filters = _filter_kwargs(compression, compression_level, fletcher32)
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ValueError(f"max_bad_fraction={max_bad_fraction} must be between 0 and 1")
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers} must be >= 1 (or None for the CPU count)")
    out_path = Path(out)
    if out_path.suffix == fmt.PARTIAL_SUFFIX:
        raise ValueError(f"output {out} must not end in {fmt.PARTIAL_SUFFIX}")
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (CLI: --overwrite) to replace")
    catalog = src if isinstance(src, Catalog) else discover(src, manifest=manifest)
    partial = str(out_path) + fmt.PARTIAL_SUFFIX
    spool = partial + ".blob"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    config_json = json.dumps({
        "image": json.loads(image.to_json()), "compression": compression or "none",
        "compression_level": compression_level, "fletcher32": fletcher32,
    }, sort_keys=True, separators=(",", ":"))
    try:
        result = _write(catalog, partial, spool, image, filters, config_json, workers,
                        max_bad_fraction, source_url, source_sha256, progress, on_progress,
                        compression, compression_level)
        from h5forge.verify import verify_unsealed

        verify_unsealed(partial)
        with h5py.File(partial, "r+") as h5:
            h5.attrs[fmt.A_SEALED] = True
        _fsync(partial)
        os.replace(partial, out_path)
        with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
            _fsync(out_path.parent)
    finally:
        for p in (partial, spool):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    return PackResult(path=str(out_path), bytes=out_path.stat().st_size,
                      seconds=time.perf_counter() - t0, **result)


def _write(catalog: Catalog, partial: str, spool: str, image: ImageConfig,
           filters: dict[str, Any], config_json: str, workers: int | None,
           max_bad_fraction: float, source_url: str, source_sha256: str, show: bool,
           on_progress: Callable[[int, int], None] | None, compression: str | None,
           compression_level: int | None) -> dict[str, Any]:
    from h5forge import __version__

    total = len(catalog.samples)
    bar = _Progress(total, show, on_progress)
    try:
        with h5py.File(partial, "w") as h5:
            sink = _Sink(h5, image, spool, filters, total)
            results = iter_processed([s.path for s in catalog.samples], image, workers=workers)
            try:
                kept, bad = _collect(results, catalog, sink, bar)
            finally:
                close = getattr(results, "close", None)
                if close is not None:
                    close()
            _check_quarantine(catalog, kept, bad, max_bad_fraction)
            byte_ranges = sink.finish(spool)
            samples = [catalog.samples[i] for i in kept]
            split_names = list(catalog.splits) or [""]
            h5.create_dataset(fmt.BYTE_RANGES, data=byte_ranges)
            h5.create_dataset(fmt.LABELS, data=np.array([s.label for s in samples], np.int64))
            h5.create_dataset(fmt.SPLITS, data=np.array(
                [split_names.index(s.split) for s in samples], np.uint8))
            _strings(h5, fmt.SPLIT_NAMES, split_names)
            _strings(h5, fmt.CLASSES, list(catalog.classes))
            _strings(h5, fmt.PATHS, [s.relpath for s in samples])
            h5.create_dataset(fmt.DIGESTS, data=np.frombuffer(
                b"".join(sink.digests), np.uint8).reshape(len(samples), fmt.DIGEST_SIZE))
            _strings(h5, fmt.QUARANTINE_PATHS, [p for p, _ in bad])
            _strings(h5, fmt.QUARANTINE_REASONS, [r for _, r in bad])
            comp = compression or "none"
            if comp != "none" and compression_level is not None:
                comp = f"{comp}-{compression_level}"
            h5.attrs.update({
                fmt.A_FORMAT: fmt.FORMAT_NAME, fmt.A_VERSION: fmt.FORMAT_VERSION,
                fmt.A_H5FORGE_VERSION: __version__,
                fmt.A_CREATED_AT: datetime.now(timezone.utc).isoformat(timespec="seconds"),
                fmt.A_LAYOUT: image.layout, fmt.A_STORAGE: sink.storage,
                fmt.A_ENCODING: "raw" if image.layout == "decoded" else image.encoding,
                fmt.A_MODE: image.mode, fmt.A_CONFIG_JSON: config_json,
                fmt.A_CONFIG_SHA256: hashlib.sha256(config_json.encode()).hexdigest(),
                fmt.A_SOURCE_URL: source_url, fmt.A_SOURCE_SHA256: source_sha256,
                fmt.A_NUM_SAMPLES: len(samples), fmt.A_NUM_CLASSES: len(catalog.classes),
                fmt.A_NUM_QUARANTINED: len(bad), fmt.A_DIGEST_ALGORITHM: fmt.DIGEST_ALGORITHM,
                fmt.A_COMPRESSION: comp + ("+fletcher32" if "fletcher32" in filters else ""),
            })
            h5.flush()
    finally:
        bar.close()
    _fsync(partial)
    counts: dict[str, dict[str, int]] = {}
    for s in samples:
        per = counts.setdefault(s.split, {})
        per[catalog.classes[s.label]] = per.get(catalog.classes[s.label], 0) + 1
    return {"num_samples": len(samples), "num_quarantined": len(bad),
            "num_classes": len(catalog.classes), "classes": tuple(catalog.classes),
            "quarantined": tuple(bad), "counts": counts}


def _check_quarantine(catalog: Catalog, kept: list[int], bad: list[tuple[str, str]],
                      max_bad_fraction: float) -> None:
    total = len(catalog.samples)
    if bad and len(bad) > max_bad_fraction * total:
        first = "\n  ".join(f"{p}: {r}" for p, r in bad[:10])
        raise TooManyBadImagesError(
            f"{len(bad)} of {total} inputs ({len(bad) / total:.1%}) were quarantined, more than "
            f"max_bad_fraction={max_bad_fraction:g} allows; first reasons:\n  {first}\n"
            "fix or remove these files, or raise max_bad_fraction", bad)
    present = {catalog.samples[i].label for i in kept}
    for label, name in enumerate(catalog.classes):
        if label not in present:
            raise EmptyDatasetError(
                f"class {name!r} has no readable image in {catalog.root}: every file of it was "
                "quarantined; fix the files or remove the class folder")
