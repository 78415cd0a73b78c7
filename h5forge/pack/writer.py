"""Pack a catalog of images into one sealed h5forge file (format v1).

The writer is the only process that touches the HDF5 file; preprocessing runs in a process
pool and streams results back in order (see :mod:`h5forge.preprocess.pool`). The file is written as
``OUT.partial``, flushed, fsynced while it is verified, sealed (the ``sealed`` attribute is set
last), and only then renamed to ``OUT``: an interrupted pack never leaves a file named ``OUT``.
One pack per output: the writer holds ``OUT.lock`` (:func:`h5forge.files.output_lock`), creates
``OUT.partial`` and its spool exclusively (a planted symlink or hard link at either name is
refused, never written through), and checks that every later open of the ``.partial`` by name
is still the inode it created.
Everything but the image bytes is placed at the head of the file (:mod:`h5forge.asset.placement`),
so a remote reader opens it with one ranged read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, get_args

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.placement import Head
from h5forge.asset.placement import utf8 as _utf8
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import (
    EmptyDatasetError,
    MissingExtraError,
    TooManyBadImagesError,
    UnsafePathError,
)
from h5forge.files import describe, same_file
from h5forge.options import CODEC_LEVELS, Compression, check_compression, option
from h5forge.output_lock import OutputLock, output_lock
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Processed, Quarantined
from h5forge.preprocess.pool import iter_processed

__all__ = ["COMPRESSIONS", "PackResult", "pack"]

COMPRESSIONS: tuple[str, ...] = get_args(Compression)
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
    check_compression(name, level)  # the codec-level rules of h5forge.options, shared with the CLI
    kwargs: dict[str, Any] = {"fletcher32": True} if fletcher32 else {}
    if name == "none":
        return kwargs
    if name == "lzf":
        return {**kwargs, "compression": "lzf"}
    lvl = CODEC_LEVELS[name][2] if level is None else level
    if name == "gzip":
        return {**kwargs, "compression": "gzip", "compression_opts": lvl}
    try:
        import hdf5plugin
    except ImportError as e:
        raise MissingExtraError(
            f"compression {name!r} needs the optional package hdf5plugin: "
            "pip install 'h5forge[plugins]'"
        ) from e
    if name == "blosc-lz4":
        return {
            **kwargs,
            **hdf5plugin.Blosc(cname="lz4", clevel=lvl, shuffle=hdf5plugin.Blosc.SHUFFLE),
        }
    return {**kwargs, **hdf5plugin.Zstd(clevel=lvl)}


def _strings(h5: h5py.File, name: str, values: list[str]) -> None:
    h5.create_dataset(
        name,
        data=np.array([_utf8(v) for v in values], dtype=object),
        dtype=h5py.string_dtype("utf-8"),
        shape=(len(values),),
    )


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Progress:
    """A rich progress bar when asked for, plus the caller's callback."""

    def __init__(self, total: int, show: bool, callback: Callable[[int, int], None] | None):
        self.total, self.callback, self._bar, self._task = total, callback, None, None
        if show:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            # rich's default columns end in the time *remaining*, which reads 0:00:00 once the
            # pack is done (and on every line a log captures): show count, elapsed and rate.
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("pack", total=total, rate="")
        self._t0 = time.perf_counter()

    def advance(self, done: int) -> None:
        if self._bar is not None:
            rate = done / max(time.perf_counter() - self._t0, 1e-9)
            self._bar.update(
                self._task,  # type: ignore[arg-type]
                completed=done,
                rate=f"{rate:,.0f} img/s",
            )
        if self.callback is not None:
            self.callback(done, self.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Sink:
    """Receives processed samples in order: array storage writes each as one chunk at once,
    blob storage spools the bytes and copies them behind the head when the count is known."""

    def __init__(
        self, image: ImageConfig, spool_path: str, filters: dict[str, Any], lock: OutputLock
    ) -> None:
        self.storage: fmt.Storage = _storage(image)
        self.digests: list[bytes] = []
        self.shapes: list[tuple[int, int, int]] = []
        self.lengths: list[int] = []
        self.images: h5py.Dataset | None = None
        self._spool = None
        self._direct = not filters
        if self.storage == "array":
            assert image.size is not None
            self._shape = (*image.size, 1 if image.mode == "L" else 3)
        else:
            if filters:
                raise ValueError(
                    "compression and fletcher32 apply to the fixed-size decoded layout only; "
                    "blob storage (encoded, or resize='none') stays uncompressed so each sample "
                    "is one byte range — drop the compression options"
                )
            # Read back in finish() through this same handle, never reopened by name.
            self._spool = os.fdopen(lock.create(spool_path, 0o600, flags=os.O_RDWR), "w+b")

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()

    def images_kwargs(self, total: int, filters: dict[str, Any]) -> dict[str, Any]:
        """``create_dataset`` arguments of ``/images`` (blob: after every sample was added)."""
        if self.storage == "array":
            return {
                "shape": (total, *self._shape),
                "maxshape": (None, *self._shape),
                "dtype": np.uint8,
                "chunks": (1, *self._shape),
                **filters,
            }
        return {"shape": (sum(self.lengths),), "dtype": np.uint8}

    def add(self, r: Processed) -> None:
        j = len(self.digests)
        if self.storage == "array":
            assert self.images is not None
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

    def finish(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Lay out the image bytes for good; return ``byte_ranges`` and (blob) ``offsets``."""
        n = len(self.digests)
        images = self.images
        assert images is not None
        if self.storage == "array":
            images.resize(n, axis=0)
            ranges = chunk_ranges(images, n)
            assert (ranges >= 0).all(), "every sample was written as one chunk"
            return ranges.astype(np.uint64), None
        assert self._spool is not None
        offsets = np.zeros(n + 1, np.uint64)
        np.cumsum(np.asarray(self.lengths, np.uint64), out=offsets[1:])
        with self._spool as f:
            f.flush()
            f.seek(0)
            pos = 0
            while block := f.read(_COPY_BLOCK):
                images[pos : pos + len(block)] = np.frombuffer(block, np.uint8)
                pos += len(block)
        base = images.id.get_offset() or 0
        return np.stack([offsets[:-1] + np.uint64(base), np.diff(offsets)], axis=1), offsets


def _storage(image: ImageConfig) -> fmt.Storage:
    return "array" if image.layout == "decoded" and image.resize != "none" else "blob"


def _collect(
    results: Iterator[Processed | Quarantined], catalog: Catalog, sink: _Sink, progress: _Progress
) -> tuple[list[int], list[tuple[str, str]]]:
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


def pack(
    src: str | os.PathLike[str] | Catalog,
    out: str | os.PathLike[str],
    *,
    image: ImageConfig | None = None,
    compression: str | None = None,
    compression_level: int | None = None,
    fletcher32: bool = False,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    manifest: str | os.PathLike[str] | None = None,
    source_url: str = "",
    source_sha256: str = "",
    progress: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> PackResult:
    """Pack an image folder, manifest or :class:`Catalog` into a sealed h5forge file.

    Args:
        src: dataset root (ImageFolder layout, or the folder a ``manifest`` is relative to), or
            a catalog from :func:`h5forge.discover.catalog.discover`.
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
        BusyError: another live run is writing ``out`` (the message names its pid and host).
        UnsafePathError: ``OUT.partial``, its spool or ``OUT.lock`` is taken by something
            h5forge did not make (a planted symlink or hard link); nothing is written through it.
        TooManyBadImagesError: too many inputs were quarantined (lists the first reasons).
        EmptyDatasetError: nothing usable, or a class lost all its images to quarantine.
    """
    return _pack(
        src,
        out,
        image=image,
        compression=compression,
        compression_level=compression_level,
        fletcher32=fletcher32,
        workers=workers,
        max_bad_fraction=max_bad_fraction,
        manifest=manifest,
        source_url=source_url,
        source_sha256=source_sha256,
        progress=progress,
        on_progress=on_progress,
        overwrite=overwrite,
        every_class=True,
    )


def _pack(
    src: str | os.PathLike[str] | Catalog,
    out: str | os.PathLike[str],
    *,
    image: ImageConfig | None,
    compression: str | None,
    compression_level: int | None,
    fletcher32: bool,
    workers: int | None,
    max_bad_fraction: float,
    manifest: str | os.PathLike[str] | None,
    source_url: str,
    source_sha256: str,
    progress: bool,
    on_progress: Callable[[int, int], None] | None,
    overwrite: bool,
    every_class: bool,
) -> PackResult:
    """:func:`pack`; ``every_class=False`` lets a shard (a slice of a catalog) lack classes."""
    t0 = time.perf_counter()
    image = image or ImageConfig()
    image.validate()
    filters = _filter_kwargs(compression, compression_level, fletcher32)
    option("workers").check(workers)
    out_path = _check_output(out, overwrite, max_bad_fraction, "(CLI: --overwrite) ")
    catalog = src if isinstance(src, Catalog) else discover(src, manifest=manifest)
    partial = str(out_path) + fmt.PARTIAL_SUFFIX
    spool = partial + ".blob"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    config_json = _config_json(image, compression, compression_level, fletcher32)
    with output_lock(out_path) as lock:  # BusyError while another run writes out_path
        # Again, now that no other run can: one may have finished since the check above.
        _check_output(out, overwrite, max_bad_fraction, "(CLI: --overwrite) ")
        lock.remove_leftovers()  # what a killed run recorded making: its partial and spool
        try:
            result = _write(
                catalog,
                partial,
                spool,
                image,
                filters,
                config_json,
                workers,
                max_bad_fraction,
                source_url,
                source_sha256,
                progress,
                on_progress,
                compression,
                compression_level,
                every_class,
                lock,
            )
            _seal(partial, out_path, lock)
        finally:
            lock.discard()  # this run's partial and spool; never a file it did not create
    return PackResult(
        path=str(out_path),
        bytes=out_path.stat().st_size,
        seconds=time.perf_counter() - t0,
        **result,
    )


def _config_json(
    image: ImageConfig, compression: str | None, compression_level: int | None, fletcher32: bool
) -> str:
    """The ``config_json`` root attribute: canonical JSON of what decides the stored bytes."""
    return json.dumps(
        {
            "image": json.loads(image.to_json()),
            "compression": compression or "none",
            "compression_level": compression_level,
            "fletcher32": fletcher32,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _create_h5(path: str, lock: OutputLock) -> h5py.File:
    """Create the HDF5 file ``path`` exclusively (HDF5's ``H5F_ACC_EXCL``: ``O_CREAT|O_EXCL``,
    which refuses any existing name, a symlink included) and record it as this run's."""
    try:
        h5 = h5py.File(path, "x")
    except FileExistsError:
        raise UnsafePathError(
            f"cannot create {path}: {describe(path)} already has that name and no h5forge run "
            "recorded making it; h5forge never writes through an existing name or a link — "
            "remove it if it is a leftover of yours, or choose another output"
        ) from None
    try:
        lock.adopt(path, h5.id.get_vfd_handle())
    except BaseException:
        h5.close()
        raise
    return h5


def _open_own(path: str, lock: OutputLock, mode: str = "r+") -> h5py.File:
    """Reopen a file this run created, checking it is still the very inode it created.

    Raises:
        UnsafePathError: the name now leads to another file (swapped for a link meanwhile).
    """
    h5 = h5py.File(path, mode)
    try:
        if not same_file(os.fstat(h5.id.get_vfd_handle()), lock.identity(path)):
            raise UnsafePathError(
                f"{path} is no longer the file this run created (replaced, or swapped for a "
                "link, while the pack ran); nothing was written to it — find out who writes "
                "into this folder, then pack again"
            )
    except BaseException:
        h5.close()
        raise
    return h5


def _seal(partial: str, out_path: Path, lock: OutputLock, *, check_digests: bool = True) -> None:
    """Digest the metadata, verify ``partial``, seal it (attribute last), fsync, rename.

    ``check_digests=False`` verifies structure only, for writers that already checked every
    sample's digest from the bytes they wrote (the shard merge). Every reopen by name is
    checked to be the inode ``lock`` recorded creating.
    """
    from h5forge.verify.checks import verify_unsealed

    with _open_own(partial, lock) as h5:  # covers every attribute but itself and ``sealed``
        # modify() rewrites an attribute in place (h5py's item assignment deletes and
        # recreates it), keeping the root object header where the writer put it: at the head.
        h5.attrs.modify(fmt.A_METADATA_SHA256, metadata_sha256(h5))
    # The data must be durable before the seal is written; flushing it to disk and reading it
    # back to verify are independent, so they run at the same time.
    with ThreadPoolExecutor(1) as pool:
        synced = pool.submit(_fsync, partial)
        verify_unsealed(partial, check_digests=check_digests)
        synced.result()
    with _open_own(partial, lock) as h5:
        h5.attrs.modify(fmt.A_SEALED, True)
    _fsync(partial)
    if not same_file(os.lstat(partial), lock.identity(partial)):
        raise UnsafePathError(f"{partial} is no longer the file this run created; not renamed")
    _replace(partial, out_path)
    lock.forget(partial)
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        _fsync(out_path.parent)


def _replace(partial: str, out_path: Path) -> None:
    """``os.replace``, with the blocks of a replaced file freed on a background thread.

    Replacing a large file makes the rename free all of its blocks (0.1 s for 350 MB on ext4)
    before it returns. An open descriptor keeps the old file's blocks allocated past the
    rename; closing it later frees them off the pack's path.
    """
    try:
        # Never blocks on a FIFO planted at the name, never opens through a link.
        old = os.open(out_path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # nothing to replace (or unreadable: the rename frees it as usual)
        old = -1
    try:
        os.replace(partial, out_path)
    finally:
        if old >= 0:
            threading.Thread(
                target=os.close, args=(old,), name="h5forge-free-replaced", daemon=True
            ).start()


def _root_attrs(
    *,
    layout: str,
    storage: str,
    encoding: str,
    mode: str,
    config_json: str,
    source_url: str,
    source_sha256: str,
    num_samples: int,
    num_classes: int,
    num_quarantined: int,
    compression: str,
) -> dict[str, Any]:
    """Every root attribute but ``sealed``, as FORMAT.md lists them."""
    from h5forge import __version__

    return {
        fmt.A_FORMAT: fmt.FORMAT_NAME,
        fmt.A_VERSION: fmt.FORMAT_VERSION,
        fmt.A_H5FORGE_VERSION: __version__,
        fmt.A_CREATED_AT: datetime.now(timezone.utc).isoformat(timespec="seconds"),
        fmt.A_LAYOUT: layout,
        fmt.A_STORAGE: storage,
        fmt.A_ENCODING: encoding,
        fmt.A_MODE: mode,
        fmt.A_CONFIG_JSON: config_json,
        fmt.A_CONFIG_SHA256: hashlib.sha256(config_json.encode()).hexdigest(),
        fmt.A_SOURCE_URL: source_url,
        fmt.A_SOURCE_SHA256: source_sha256,
        fmt.A_NUM_SAMPLES: num_samples,
        fmt.A_NUM_CLASSES: num_classes,
        fmt.A_NUM_QUARANTINED: num_quarantined,
        fmt.A_DIGEST_ALGORITHM: fmt.DIGEST_ALGORITHM,
        fmt.A_COMPRESSION: compression,
    }


def _write(
    catalog: Catalog,
    partial: str,
    spool: str,
    image: ImageConfig,
    filters: dict[str, Any],
    config_json: str,
    workers: int | None,
    max_bad_fraction: float,
    source_url: str,
    source_sha256: str,
    show: bool,
    on_progress: Callable[[int, int], None] | None,
    compression: str | None,
    compression_level: int | None,
    every_class: bool,
    lock: OutputLock,
) -> dict[str, Any]:
    total = len(catalog.samples)
    comp = compression or "none"
    if comp != "none" and compression_level is not None:
        comp = f"{comp}-{compression_level}"
    attrs = _root_attrs(
        layout=image.layout,
        storage=_storage(image),
        encoding="raw" if image.layout == "decoded" else image.encoding,
        mode=image.mode,
        config_json=config_json,
        source_url=source_url,
        source_sha256=source_sha256,
        num_samples=total,
        num_classes=len(catalog.classes),
        num_quarantined=0,
        compression=comp + ("+fletcher32" if "fletcher32" in filters else ""),
    )
    split_names = list(catalog.splits) or [""]
    bar = _Progress(total, show, on_progress)
    try:
        with contextlib.ExitStack() as stack:
            sink = _Sink(image, spool, filters, lock)
            stack.callback(sink.close)

            def head(capacity: int) -> tuple[h5py.File, Head]:
                # Everything but the image bytes goes first (see h5forge.asset.placement).
                h5 = stack.enter_context(_create_h5(partial, lock))
                made = Head(
                    h5,
                    attrs,
                    storage=sink.storage,
                    capacity=capacity,
                    classes=catalog.classes,
                    split_names=split_names,
                    images=sink.images_kwargs(capacity, filters),
                )
                sink.images = made.images
                return h5, made

            if sink.storage == "array":  # chunks are written as samples arrive
                h5, index = head(total)
            else:  # the file is written once the sizes are known; mark the pack as under way
                os.close(lock.create(partial, 0o644))
            results = iter_processed(
                [s.path for s in catalog.samples], image, workers=workers, borrow=True
            )  # sink.add() writes each before the next
            try:
                kept, bad = _collect(results, catalog, sink, bar)
            finally:
                close = getattr(results, "close", None)
                if close is not None:
                    close()
            _check_quarantine(catalog, kept, bad, max_bad_fraction, every_class)
            if sink.storage == "blob":  # sizes are known only now: the file starts here
                lock.discard_one(partial)  # the placeholder; HDF5 creates the name anew
                h5, index = head(len(kept))
            byte_ranges, offsets = sink.finish()
            samples = [catalog.samples[i] for i in kept]
            index.finish(
                byte_ranges=byte_ranges,
                labels=np.array([s.label for s in samples], np.int64),
                splits=np.array([split_names.index(s.split) for s in samples], np.uint8),
                digests=np.frombuffer(b"".join(sink.digests), np.uint8).reshape(
                    len(samples), fmt.DIGEST_SIZE
                ),
                paths=[s.relpath for s in samples],
                quarantine=bad,
                offsets=offsets,
                shapes=np.asarray(sink.shapes, np.uint32).reshape(len(samples), 3),
            )
            h5.flush()
    finally:
        bar.close()
    counts: dict[str, dict[str, int]] = {}
    for s in samples:
        per = counts.setdefault(s.split, {})
        per[catalog.classes[s.label]] = per.get(catalog.classes[s.label], 0) + 1
    return {
        "num_samples": len(samples),
        "num_quarantined": len(bad),
        "num_classes": len(catalog.classes),
        "classes": tuple(catalog.classes),
        "quarantined": tuple(bad),
        "counts": counts,
    }


def _check_output(
    out: str | os.PathLike[str], overwrite: bool, max_bad_fraction: float, how: str = ""
) -> Path:
    """The output path of a pack or merge, after checking it and ``max_bad_fraction``."""
    option("max_bad_fraction").check(max_bad_fraction)
    out_path = Path(out)
    if out_path.suffix == fmt.PARTIAL_SUFFIX:
        raise ValueError(f"output {out} must not end in {fmt.PARTIAL_SUFFIX}")
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True {how}to replace it")
    return out_path


def _check_quarantine(
    catalog: Catalog,
    kept: list[int],
    bad: list[tuple[str, str]],
    max_bad_fraction: float,
    every_class: bool = True,
) -> None:
    _check_bad_fraction(len(catalog.samples), bad, max_bad_fraction)
    if not every_class:
        return
    present = {catalog.samples[i].label for i in kept}
    _check_every_class(present, catalog.classes, catalog.root)


def _check_bad_fraction(
    total: int, bad: Sequence[tuple[str, str]], max_bad_fraction: float
) -> None:
    """Raise ``TooManyBadImagesError`` when more than the allowed fraction was quarantined."""
    if bad and len(bad) > max_bad_fraction * total:
        first = "\n  ".join(f"{p}: {r}" for p, r in bad[:10])
        raise TooManyBadImagesError(
            f"{len(bad)} of {total} inputs ({len(bad) / total:.1%}) were quarantined, more than "
            f"max_bad_fraction={max_bad_fraction:g} allows; first reasons:\n  {first}\n"
            "fix or remove these files, or raise max_bad_fraction",
            list(bad),
        )


def _check_every_class(present: Collection[int], classes: Sequence[str], where: str) -> None:
    """Raise ``EmptyDatasetError`` when a class has no packed sample."""
    for label, name in enumerate(classes):
        if label not in present:
            raise EmptyDatasetError(
                f"class {name!r} has no readable image in {where}: every file of it was "
                "quarantined; fix the files or remove the class folder"
            )
