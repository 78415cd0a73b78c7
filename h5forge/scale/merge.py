"""Merge shard files into one h5forge file by copying stored bytes, never decoding.

Array storage copies every chunk as stored, so compressed chunks are not recompressed and raw
ones are not touched: unfiltered chunks go file to file in runs (into chunks allocated when
``/images`` is created), filtered ones one by one (``write_direct_chunk``, the filter mask
carried over). Blob storage copies each shard's ``/images`` bytes into the output blob and
rebases ``/offsets``. Digests, labels, splits, paths and quarantine lists are concatenated.

How the copy is checked, per shard (:mod:`h5forge.scale.checked_copy`):

- **A published shard** (its manifest, written last by :func:`h5forge.publish.storage.publish`, lies
  next to it): the whole shard file's sha256 is checked against the manifest's
  (:mod:`h5forge.scale.file_check`). The hashes start as soon as each manifest is read, in the
  survey (:mod:`h5forge.scale.survey`), on a pool of threads (two files at once with two or
  more CPUs) reading the files through ``mmap`` while the copy runs; the copy itself stays in
  the kernel (``os.copy_file_range`` for raw chunks and blobs, :mod:`h5forge.scale.kernel_copy`;
  filtered chunks are read with ``pread`` and written with ``write_direct_chunk``, not inflated).
  The file's identity (device, inode, size, mtime) when surveyed, hashed and copied must be one
  and the same. A mismatch raises :class:`~h5forge.errors.IntegrityError` naming the shard,
  both digests and the fix.
- **A bare sealed file** (no manifest, or an unreadable one): every sample's sha256 is
  computed from the bytes in hand (on helper threads, while the next block is copied with
  ``pread``/``pwrite``) and compared with its shard's digest; a filtered chunk is
  decompressed for that (the digest covers the pixels).

Every check is settled before the seal: a mismatch leaves nothing at ``out``. The output is
then sealed after a structural verify (counts, labels, metadata digest, byte ranges against the
HDF5 layout) that does not hash the samples again. After each shard the output's dirty pages
are sent to disk without waiting (``sync_file_range`` on Linux, else ``fdatasync`` on a helper
thread), so the fsync before the seal, which runs beside the verify, finds little left; seal,
rename as :func:`h5forge.pack.writer.pack`.

The output has the writer's physical layout (:class:`h5forge.asset.placement.Head`: the index at the
head of the file, the image bytes after it). Remote shards are downloaded one at a time and the
local copy is what is hashed.

Memory: no image byte passes through Python for a published shard of raw chunks or a blob;
otherwise image bytes stream in blocks (at most 48 MiB wait for their hash); per-sample index
arrays are read one shard at a time; only the quarantine list and, for array storage, the chunk
``/byte_ranges`` (16 bytes per sample) are held whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.asset.index import load_index
from h5forge.asset.open import is_local, open_h5, url_to_fs
from h5forge.asset.placement import Head, _early
from h5forge.errors import EmptyDatasetError, IntegrityError, UnsafePathError
from h5forge.files import same_file
from h5forge.output_lock import OutputLock, output_lock
from h5forge.pack.writer import (
    PackResult,
    _check_bad_fraction,
    _check_every_class,
    _check_output,
    _create_h5,
    _filter_kwargs,
    _root_attrs,
    _seal,
)
from h5forge.scale.checked_copy import (
    CheckedCopy,
    copy_blob,
    copy_filtered,
    copy_raw,
)
from h5forge.scale.file_check import FileChecks, FileIdentity
from h5forge.scale.kernel_copy import RangeCopy, writeback_starter
from h5forge.scale.survey import Shard, survey

__all__ = ["merge_shards"]

_ROWS = 1 << 20  # index rows handled at a time


@contextlib.contextmanager
def _local_copy(
    url: str, options: dict[str, Any] | None, tmp_dir: str | os.PathLike[str] | None
) -> Iterator[str]:
    """A local path for ``url``: itself when local, else a download deleted afterwards.

    The download is a temporary file in ``tmp_dir``; nothing is created for a local shard.
    """
    fs, path = url_to_fs(url, options)
    if is_local(fs):
        yield path
        return
    fd, local = tempfile.mkstemp(prefix="h5forge-merge-", suffix=".h5", dir=tmp_dir)
    os.close(fd)
    try:
        fs.get_file(path, local)
        yield local
    finally:
        os.unlink(local)


def _images_kwargs(first: Shard, n: int, blob_bytes: int) -> dict[str, Any]:
    """``create_dataset`` arguments of the output's ``/images``, as the writer makes them.

    Unfiltered chunks are allocated at creation (``H5D_ALLOC_TIME_EARLY``, in order, right
    after the head): their offsets are known before the first byte is copied, so the copy moves
    whole runs of chunks (``copy_file_range``, or ``pread``/``pwrite``) instead of making one
    HDF5 call per chunk.
    """
    if first.attrs[fmt.A_STORAGE] == "blob":
        return {"shape": (blob_bytes,), "dtype": np.uint8}
    config = json.loads(first.attrs[fmt.A_CONFIG_JSON])
    filters = _filter_kwargs(
        config["compression"], config["compression_level"], config["fletcher32"]
    )
    shape = first.image_shape
    early = {} if filters else {"dcpl": _early(False)}
    return {
        "shape": (n, *shape),
        "maxshape": (None, *shape),
        "dtype": np.uint8,
        "chunks": (1, *shape),
        **filters,
        **early,
    }


def _filter_ids(images: h5py.Dataset) -> tuple[int, ...]:
    plist = images.id.get_create_plist()
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def _byte_ranges(head: Head, n: int, blob: bool) -> None:
    images, out = head.images, head.ds[fmt.BYTE_RANGES]
    if blob:
        base = np.uint64(images.id.get_offset() or 0)
        for lo in range(0, n, _ROWS):
            off = head.ds[fmt.OFFSETS][lo : min(n, lo + _ROWS) + 1]
            out[lo : lo + len(off) - 1] = np.stack([off[:-1] + base, np.diff(off)], axis=1)
        return
    out[...] = chunk_ranges(images, n).astype(np.uint64)


@dataclass
class _Out:
    """The output being written, and where the next shard's samples go."""

    head: Head
    fd: int  # the .partial, for copies HDF5 does not see
    dst: np.ndarray | None  # (offset, size) of every raw chunk, allocated at creation
    blob_offset: int  # file offset of the output blob
    check: CheckedCopy  # per-sample checks, for shards without a manifest
    copy: RangeCopy
    filters: tuple[int, ...]
    base: int = 0  # first sample of the next shard
    pos: int = 0  # blob bytes copied so far


def _copy_shard(out: _Out, shard: Shard, local: str, src_fd: int) -> None:
    """Copy one shard's index and stored image bytes into the output."""
    ds, base, stop = out.head.ds, out.base, out.base + shard.n
    # A published shard is checked by its file's sha256: no per-sample hash.
    check = None if shard.expected is not None else out.check
    # Through the checked open: a downloaded shard is a new file, not the one surveyed.
    with open_h5(local) as src:
        if load_index(src, where=shard.url).header.num_samples != shard.n:
            raise IntegrityError(
                f"{shard.url} changed during the merge: it held {shard.n} "
                "samples when surveyed and holds a different number now; "
                "run the merge again"
            )
        digests = src[fmt.DIGESTS][()]
        ds[fmt.DIGESTS][base:stop] = digests
        for name in (fmt.LABELS, fmt.SPLITS):
            ds[name][base:stop] = src[name][()]
        ds[fmt.PATHS][base:stop] = src[fmt.PATHS].asstr()[()].astype(object)

        def label(j: int) -> str:
            return f"sample {base + j} (sample {j} of {shard.url})"

        if shard.attrs[fmt.A_STORAGE] == "blob":
            offsets = src[fmt.OFFSETS][()]
            ds[fmt.OFFSETS][base + 1 : stop + 1] = offsets[1:] + np.uint64(out.pos)
            ds[fmt.SHAPES][base:stop] = src[fmt.SHAPES][()]
            out.pos += copy_blob(
                check,
                src_fd,
                local,
                src[fmt.IMAGES],
                out.fd,
                out.blob_offset + out.pos,
                offsets,
                digests,
                label,
                out.copy,
            )
        elif out.dst is not None:
            copy_raw(
                check, src_fd, src[fmt.IMAGES], out.fd, out.dst[base:stop], digests, label, out.copy
            )
        else:
            copy_filtered(
                check, src_fd, src[fmt.IMAGES], out.head.images, base, digests, label, out.filters
            )
    out.base = stop


def _write(
    partial: str,
    shards: list[Shard],
    options: dict[str, Any] | None,
    tmp_dir: str | os.PathLike[str] | None,
    bad: list[tuple[str, str]],
    attrs: dict[str, Any],
    files: FileChecks,
    lock: OutputLock,
) -> None:
    first = shards[0]
    n = sum(s.n for s in shards)
    blob = first.attrs[fmt.A_STORAGE] == "blob"
    raw = not blob and not first.filters
    blob_bytes = sum(s.image_shape[0] for s in shards) if blob else 0
    with contextlib.ExitStack() as stack:
        h5 = stack.enter_context(_create_h5(partial, lock))  # exclusive: never via a link
        # The same physical layout as the writer's: index at the head, image bytes after it.
        head = Head(
            h5,
            attrs,
            storage=cast(fmt.Storage, first.attrs[fmt.A_STORAGE]),
            capacity=n,
            classes=first.classes,
            split_names=first.split_names,
            images=_images_kwargs(first, n, blob_bytes),
        )
        ds, images = head.ds, head.images
        if _filter_ids(images) != first.filters:
            raise ValueError(
                f"config_json of {first.url} gives /images filters "
                f"{_filter_ids(images)}, the shard has {first.filters}; the shard "
                "is inconsistent, re-pack it"
            )
        fd = os.open(partial, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        stack.callback(os.close, fd)
        if not same_file(os.fstat(fd), lock.identity(partial)):
            raise UnsafePathError(
                f"{partial} was replaced while the merge opened it; "
                "find out who writes into this folder, then merge again"
            )
        out = _Out(
            head=head,
            fd=fd,
            dst=chunk_ranges(images, n) if raw else None,
            blob_offset=(images.id.get_offset() or 0) if blob else 0,
            check=stack.enter_context(CheckedCopy()),
            copy=RangeCopy(),
            filters=first.filters,
        )
        # Written pages start going to disk while later shards are copied, so the fsync
        # before the seal finds little left to do.
        writeback = writeback_starter()
        flusher = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="h5forge-sync"))
        flushing: Future[None] | None = None
        for i, shard in enumerate(shards):
            with _local_copy(shard.url, options, tmp_dir) as local:
                src_fd = os.open(local, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    # A local shard must still be the file surveyed (and hashed); a remote
                    # one is the download, hashed now, before the download is deleted.
                    opened = shard.identity or FileIdentity.of(src_fd)
                    if shard.expected is not None and i not in files:
                        files.start(i, local, shard.expected)
                    if shard.n:  # else every input of it was quarantined
                        _copy_shard(out, shard, local, src_fd)
                    if shard.expected is not None:
                        files.copied(i, local, src_fd, opened)
                        if shard.identity is None:
                            files.settle(i)
                finally:
                    os.close(src_fd)
            if out.check.failures:  # stop at the first damaged shard
                break
            files.settle_finished()
            if flushing is None or flushing.done():
                flushing = flusher.submit(writeback, fd)
        files.settle_all()
        failures = out.check.wait()
        if failures:
            raise IntegrityError(
                f"merging into {partial}: {len(failures)} sample(s) do not match the digests "
                "their shard recorded, so a shard changed after it was packed; run the build "
                "again (find_done_shards re-packs shards whose file no longer matches their "
                "manifest) or re-pack the shards named below",
                failures[:100],
            )
        if blob:
            ds[fmt.OFFSETS][0] = 0
        if out.dst is not None:
            ds[fmt.BYTE_RANGES][...] = out.dst.astype(np.uint64)
        else:
            _byte_ranges(head, n, blob)
        for name, col in ((fmt.QUARANTINE_PATHS, 0), (fmt.QUARANTINE_REASONS, 1)):
            if bad:
                ds[name].resize(len(bad), axis=0)
                ds[name][...] = np.array([q[col] for q in bad], dtype=object)
        h5.flush()  # _seal() fsyncs it while it verifies
        if flushing is not None:
            flushing.result()


def merge_shards(
    shards: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    max_bad_fraction: float = 0.01,
    source_url: str = "",
    source_sha256: str = "",
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> PackResult:
    """Merge sealed shard files, in the given order, into one sealed file at ``out``.

    Args:
        shards: shard files (local paths or fsspec URLs), in sample order.
        out: local path of the merged ``.h5``.
        max_bad_fraction: fail when more than this fraction of all inputs (packed plus
            quarantined, over every shard) was quarantined.
        source_url, source_sha256: recorded as root attributes (redact the URL first).
        storage_options: for remote shard URLs; remote shards are downloaded one at a time.
            A shard whose manifest (``url + ".manifest.json"``) is found is checked by the
            whole file's sha256, otherwise sample by sample.
        overwrite: replace an existing ``out``.
        tmp_dir: local scratch folder for downloaded shards; default the system's.

    Returns:
        The same summary :func:`h5forge.pack.writer.pack` returns.

    Raises:
        ValueError: no shards, or shards that disagree (configuration, classes, splits,
            storage, image shape, filters).
        UnsealedFileError: a shard is ``.partial``, unsealed or of an unknown version.
        IntegrityError: a published shard's file does not match its manifest (sha256 or size)
            or changed during the merge; a bare shard's sample does not match its digest.
            Nothing is left at ``out``.
        TooManyBadImagesError: too many inputs were quarantined in total.
        EmptyDatasetError: a class has no packed sample in any shard.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        BusyError: another live run is writing ``out`` (the message names its pid and host).
        UnsafePathError: ``OUT.partial`` or ``OUT.lock`` is taken by something h5forge did not
            make (a planted symlink or hard link); nothing is written through it.
    """
    t0 = time.perf_counter()
    urls = [os.fspath(s) for s in shards]
    if not urls:
        raise ValueError("no shards to merge; pack them first with h5forge.scale.shards.pack_shard")
    out_path = _check_output(out, overwrite, max_bad_fraction)
    options = dict(storage_options) if storage_options else None
    # Leaving this stops the shard hashes still running (the merge failed).
    with FileChecks() as files:
        return _merge(
            urls,
            out_path,
            files,
            options,
            max_bad_fraction=max_bad_fraction,
            source_url=source_url,
            source_sha256=source_sha256,
            tmp_dir=tmp_dir,
            t0=t0,
            overwrite=overwrite,
        )


def _merge(
    urls: list[str],
    out_path: Path,
    files: FileChecks,
    options: dict[str, Any] | None,
    *,
    max_bad_fraction: float,
    source_url: str,
    source_sha256: str,
    tmp_dir: str | os.PathLike[str] | None,
    t0: float,
    overwrite: bool,
) -> PackResult:
    found, counts, bad = survey(urls, options, files)
    first, n = found[0], sum(s.n for s in found)
    if n == 0:
        raise EmptyDatasetError(
            f"the {len(urls)} shards hold no sample; every input was quarantined"
        )
    _check_bad_fraction(n + len(bad), bad, max_bad_fraction)
    _check_every_class(
        set(np.flatnonzero(counts.sum(axis=0)).tolist()), first.classes, f"the {len(urls)} shards"
    )
    attrs = _root_attrs(
        layout=first.attrs[fmt.A_LAYOUT],
        storage=first.attrs[fmt.A_STORAGE],
        encoding=first.attrs[fmt.A_ENCODING],
        mode=first.attrs[fmt.A_MODE],
        config_json=first.attrs[fmt.A_CONFIG_JSON],
        source_url=source_url,
        source_sha256=source_sha256,
        num_samples=n,
        num_classes=len(first.classes),
        num_quarantined=len(bad),
        compression=first.attrs[fmt.A_COMPRESSION],
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = str(out_path) + fmt.PARTIAL_SUFFIX
    with output_lock(out_path) as lock:  # BusyError while another run writes out_path
        # Again, now that no other run can: one may have finished since merge_shards checked.
        _check_output(out_path, overwrite, max_bad_fraction)
        lock.remove_leftovers()  # the partial a killed merge recorded making
        try:
            _write(partial, found, options, tmp_dir, bad, attrs, files, lock)
            # The copy checked what it wrote (each shard file's sha256, or each sample's
            # digest), so the seal verifies structure only; the file's sha256 is computed when
            # published.
            _seal(partial, out_path, lock, check_digests=False)
        finally:
            lock.discard()  # this run's partial; never a file it did not create
    split_keys = [s if s else "" for s in first.split_names]
    per_split = {
        split_keys[i]: {first.classes[k]: int(c) for k, c in enumerate(row) if c}
        for i, row in enumerate(counts)
        if row.any()
    }
    return PackResult(
        path=str(out_path),
        num_samples=n,
        num_quarantined=len(bad),
        num_classes=len(first.classes),
        classes=first.classes,
        quarantined=tuple(bad),
        bytes=out_path.stat().st_size,
        seconds=time.perf_counter() - t0,
        counts=per_split,
    )
