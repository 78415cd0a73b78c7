"""Write the merged file: its head, then each part's index and stored image bytes, checked.

The output has the writer's physical layout (:class:`h5forge.asset.placement.Head`: the index
at the head of the file, the image bytes after it). Array storage copies every chunk as stored:
unfiltered chunks go file to file in runs, into chunks allocated when ``/images`` is created,
filtered ones one by one (``write_direct_chunk``, the filter mask carried over). Blob storage
copies each part's ``/images`` bytes into the output blob and rebases ``/offsets``. How each
copy is checked: :mod:`h5forge.scale.merge`.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.asset.index import load_index
from h5forge.asset.open import open_h5
from h5forge.asset.placement import Head, early_allocation
from h5forge.asset.range_copy import writeback_starter
from h5forge.asset.stored_copy import StoredCopy, copy_blob, copy_filtered, copy_raw
from h5forge.errors import IntegrityError, UnsafePathError
from h5forge.files import open_regular, same_file
from h5forge.location import Location
from h5forge.pack.commit import Staged
from h5forge.pack.config import PackConfig
from h5forge.scale.download import local_copy
from h5forge.scale.file_check import FileChecks, FileIdentity
from h5forge.scale.survey import Part

__all__ = ["assemble"]

_ROWS = 1 << 20  # index rows handled at a time


def _images_kwargs(first: Part, n: int, blob_bytes: int) -> dict[str, Any]:
    """``create_dataset`` arguments of the output's ``/images``, as the writer makes them.

    Unfiltered chunks are allocated at creation (``H5D_ALLOC_TIME_EARLY``, in order, right
    after the head): their offsets are known before the first byte is copied, so the copy moves
    whole runs of chunks (``copy_file_range``, or ``pread``/``pwrite``) instead of making one
    HDF5 call per chunk.
    """
    if first.attrs[fmt.A_STORAGE] == "blob":
        return {"shape": (blob_bytes,), "dtype": np.uint8}
    filters = PackConfig.from_json(first.attrs[fmt.A_CONFIG_JSON]).filter_kwargs()
    shape = first.image_shape
    early = {} if filters else {"dcpl": early_allocation(False)}
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
    """The output being written, and where the next part's samples go."""

    head: Head
    fd: int  # the .partial, for copies HDF5 does not see
    dst: np.ndarray | None  # (offset, size) of every raw chunk, allocated at creation
    blob_offset: int  # file offset of the output blob
    copy: StoredCopy  # checks samples of parts without a sidecar from the output's bytes
    filters: tuple[int, ...]
    base: int = 0  # first sample of the next part
    pos: int = 0  # blob bytes copied so far


def _label(parts: list[Part], row: int) -> str:
    """``sample ROW (sample J of URL)``: a row of the output named by its part."""
    base = 0
    for part in parts:
        if row < base + part.n:
            return f"sample {row} (sample {row - base} of {part.url})"
        base += part.n
    raise AssertionError(f"row {row} is past the {base} samples merged")


def _copy_part(out: _Out, part: Part, local: str, src_fd: int) -> None:
    """Copy one part's index and stored image bytes into the output."""
    ds, base, stop = out.head.ds, out.base, out.base + part.n
    # A published part is checked by its file's sha256: no per-sample hash.
    check = part.expected is None
    # Through the checked open: a downloaded part is a new file, not the one surveyed.
    with open_h5(Location(local)) as src:
        if load_index(src, where=part.url).header.num_samples != part.n:
            raise IntegrityError(
                f"{part.url} changed during the merge: it held {part.n} "
                "samples when surveyed and holds a different number now; "
                "run the merge again"
            )
        digests = src[fmt.DIGESTS][()]
        ds[fmt.DIGESTS][base:stop] = digests
        for name in (fmt.LABELS, fmt.SPLITS):
            ds[name][base:stop] = src[name][()]
        ds[fmt.PATHS][base:stop] = src[fmt.PATHS].asstr()[()].astype(object)

        def label(j: int) -> str:  # the same name _label gives row base + j
            return f"sample {base + j} (sample {j} of {part.url})"

        if part.attrs[fmt.A_STORAGE] == "blob":
            offsets = src[fmt.OFFSETS][()]
            ds[fmt.OFFSETS][base + 1 : stop + 1] = offsets[1:] + np.uint64(out.pos)
            ds[fmt.SHAPES][base:stop] = src[fmt.SHAPES][()]
            out.pos += copy_blob(
                out.copy,
                src_fd,
                local,
                src[fmt.IMAGES],
                out.fd,
                out.blob_offset + out.pos,
                offsets,
                digests,
                base=base,
                check=check,
            )
        elif out.dst is not None:
            copy_raw(
                out.copy,
                src_fd,
                src[fmt.IMAGES],
                out.fd,
                out.dst[base:stop],
                digests,
                base=base,
                check=check,
                label=label,
            )
        else:
            copy_filtered(
                out.copy,
                src_fd,
                src[fmt.IMAGES],
                out.head.images,
                digests,
                base=base,
                check=check,
                label=label,
                filters=out.filters,
            )
    out.base = stop


def assemble(
    stage: Staged,
    parts: list[Part],
    tmp_dir: str | os.PathLike[str] | None,
    bad: list[tuple[str, str]],
    attrs: dict[str, Any],
    files: FileChecks,
) -> None:
    """Write every part into ``stage.partial`` (copies checked, see
    :mod:`h5forge.scale.merge`) and flush it; the caller seals it.

    Raises:
        IntegrityError: a copied sample does not match its part's digest, or a part changed.
    """
    first = parts[0]
    n = sum(s.n for s in parts)
    blob = first.attrs[fmt.A_STORAGE] == "blob"
    raw = not blob and not first.filters
    blob_bytes = sum(s.image_shape[0] for s in parts) if blob else 0
    with contextlib.ExitStack() as stack:
        h5 = stack.enter_context(stage.create())  # exclusive: never via a link
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
                f"{_filter_ids(images)}, the part has {first.filters}; the part "
                "is inconsistent, re-pack it"
            )
        partial = stage.partial
        fd = os.open(partial, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        stack.callback(os.close, fd)
        if not same_file(os.fstat(fd), stage.lock.identity(partial)):
            raise UnsafePathError(
                f"{partial} was replaced while the merge opened it; "
                "find out who writes into this folder, then merge again"
            )
        out = _Out(
            head=head,
            fd=fd,
            dst=chunk_ranges(images, n) if raw else None,
            blob_offset=(images.id.get_offset() or 0) if blob else 0,
            copy=stack.enter_context(StoredCopy(os.fspath(partial))),
            filters=first.filters,
        )
        # Written pages start going to disk while later parts are copied, so the fsync
        # before the seal finds little left to do.
        writeback = writeback_starter()
        flusher = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="h5forge-sync"))
        flushing: Future[None] | None = None
        for i, part in enumerate(parts):
            with local_copy(part.where, tmp_dir) as local:
                src_fd = open_regular(local, "part")  # never waits on a FIFO
                try:
                    # A local part must still be the file surveyed (and hashed); a remote
                    # one is the download, hashed now, before the download is deleted.
                    opened = part.identity or FileIdentity.of(src_fd)
                    if part.expected is not None and i not in files:
                        files.start(i, local, part.expected)
                    if part.n:  # else every input of it was quarantined
                        _copy_part(out, part, local, src_fd)
                    if part.expected is not None:
                        files.copied(i, local, src_fd, opened)
                        if part.identity is None:
                            files.settle(i)
                finally:
                    os.close(src_fd)
            if out.copy.failed:  # stop at the first damaged part found
                break
            files.settle_finished()
            if flushing is None or flushing.done():
                flushing = flusher.submit(writeback, fd)
        files.settle_all()
        failures = out.copy.wait()
        if failures:
            raise IntegrityError(
                f"merging into {partial}: {len(failures)} sample(s) do not match the digests "
                "their part recorded, so a part changed after it was packed; run the build "
                "again (find_done_parts re-packs parts whose file no longer matches their "
                "sidecar) or re-pack the parts named below",
                [f"{_label(parts, m.row)}: {m.reason}" for m in failures[:100]],
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
        h5.flush()  # the seal fsyncs it while it verifies
        if flushing is not None:
            flushing.result()
