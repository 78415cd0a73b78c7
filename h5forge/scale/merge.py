"""Merge part files into one h5forge file by copying stored bytes, never decoding.

Array storage copies every chunk as stored, so compressed chunks are not recompressed and raw
ones are not touched: unfiltered chunks go file to file in runs (into chunks allocated when
``/images`` is created), filtered ones one by one (``write_direct_chunk``, the filter mask
carried over). Blob storage copies each part's ``/images`` bytes into the output blob and
rebases ``/offsets``. Digests, labels, splits, paths and quarantine lists are concatenated.

How the copy is checked, per part (:mod:`h5forge.asset.stored_copy`, the stored-copy kernel):

- **A published part** (its sidecar, written last by :func:`h5forge.publish.storage.publish`, lies
  next to it): the whole part file's sha256 is checked against the sidecar's
  (:mod:`h5forge.scale.file_check`). The hashes start as soon as each sidecar is read, in the
  survey (:mod:`h5forge.scale.survey`), on a pool of threads (two files at once with two or
  more CPUs) reading the files through ``mmap`` while the copy runs; the copy itself stays in
  the kernel (``os.copy_file_range`` for raw chunks and blobs, :mod:`h5forge.asset.range_copy`;
  filtered chunks are read with ``pread`` and written with ``write_direct_chunk``, not inflated).
  The file's identity (device, inode, size, mtime) when surveyed, hashed and copied must be one
  and the same. A mismatch raises :class:`~h5forge.errors.IntegrityError` naming the part,
  both digests and the fix.
- **A bare sealed file** (no sidecar, or an unreadable one): raw chunks and blobs are copied
  in the kernel as above, then every sample's sha256 is computed from the bytes the OUTPUT
  holds (read back on helper threads while the next part is copied) and compared with its
  part's digest; a filtered chunk is copied as stored and decompressed on helper threads to
  be checked (the digest covers the pixels). The same kernel checks an incremental pack's
  reused samples.

Every check is settled before the seal: a mismatch leaves nothing at ``out``. The output is
then sealed after a structural verify (counts, labels, metadata digest, byte ranges against the
HDF5 layout) that does not hash the samples again. After each part the output's dirty pages
are sent to disk without waiting (``sync_file_range`` on Linux, else ``fdatasync`` on a helper
thread), so the fsync before the seal, which runs beside the verify, finds little left; seal,
rename as :func:`h5forge.pack.writer.pack` (:mod:`h5forge.pack.commit`).

The output is written by :func:`h5forge.scale.assemble.assemble`, with the writer's physical
layout. Remote parts are downloaded one at a time and the local copy is what is hashed.

Memory: no image byte passes through Python for raw chunks or a blob (a bare part's are read
back through ``mmap`` of the page cache); filtered chunks stream one by one (at most 48 MiB wait
for their hash); per-sample index
arrays are read one part at a time; only the quarantine list and, for array storage, the chunk
``/byte_ranges`` (16 bytes per sample) are held whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from h5forge.asset import format as fmt
from h5forge.errors import EmptyDatasetError
from h5forge.location import Location
from h5forge.options import option
from h5forge.pack.attrs import root_attrs
from h5forge.pack.checks import check_bad_fraction, check_every_class
from h5forge.pack.commit import check_output, staged
from h5forge.pack.writer import PackResult
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.scale.assemble import assemble
from h5forge.scale.file_check import FileChecks
from h5forge.scale.survey import survey

__all__ = ["merge_parts"]


def merge_parts(
    parts: Sequence[str | os.PathLike[str] | Location],
    out: str | os.PathLike[str],
    *,
    max_bad_fraction: float = 0.01,
    source_url: str = "",
    source_sha256: str = "",
    overwrite: bool = False,
    tmp_dir: str | os.PathLike[str] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> PackResult:
    """Merge sealed part files, in the given order, into one sealed file at ``out``.

    Args:
        parts: part files in sample order: local paths, or
            :class:`~h5forge.location.Location` values (a remote part's carries its storage
            options; :func:`h5forge.scale.plan.part_location` gives them). Remote parts are
            downloaded one at a time. A part whose sidecar (``url + ".manifest.json"``) is
            found is checked by the whole file's sha256, otherwise sample by sample.
        out: local path of the merged ``.h5``.
        max_bad_fraction: fail when more than this fraction of all inputs (packed plus
            quarantined, over every part) was quarantined.
        source_url, source_sha256: recorded as root attributes (redact the URL first).
        overwrite: replace an existing ``out``.
        tmp_dir: local scratch folder for downloaded parts; default the system's.
        max_pixels: the decode bound the merged file is verified with before it is sealed:
            the ``max_image_pixels`` the parts were packed with (a build passes its
            configuration's), never one read from the parts.

    Returns:
        The same summary :func:`h5forge.pack.writer.pack` returns.

    Raises:
        ValueError: no parts, or parts that disagree (configuration, classes, splits,
            storage, image shape, filters).
        UnsealedFileError: a part is ``.partial``, unsealed or of an unknown version.
        IntegrityError: a published part's file does not match its sidecar (sha256 or size)
            or changed during the merge; a bare part's sample does not match its digest.
            Nothing is left at ``out``.
        TooManyBadImagesError: too many inputs were quarantined in total.
        EmptyDatasetError: a class has no packed sample in any part.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        BusyError: another live run is writing ``out`` (the message names its pid and host).
        UnsafePathError: ``OUT.partial`` or ``OUT.lock`` is taken by something h5forge did not
            make (a planted symlink or hard link); nothing is written through it.
    """
    t0 = time.perf_counter()
    where = [Location.of(s) for s in parts]
    if not where:
        raise ValueError("no parts to merge; pack them first with h5forge.scale.parts.pack_part")
    option("max_bad_fraction").check(max_bad_fraction)
    out_path = check_output(out, overwrite)
    # Leaving this stops the part hashes still running (the merge failed).
    with FileChecks() as files:
        return _merge(
            where,
            out_path,
            files,
            max_bad_fraction=max_bad_fraction,
            source_url=source_url,
            source_sha256=source_sha256,
            tmp_dir=tmp_dir,
            t0=t0,
            overwrite=overwrite,
            max_pixels=max_pixels,
        )


def _merge(
    parts: list[Location],
    out_path: Path,
    files: FileChecks,
    *,
    max_bad_fraction: float,
    source_url: str,
    source_sha256: str,
    tmp_dir: str | os.PathLike[str] | None,
    t0: float,
    overwrite: bool,
    max_pixels: int,
) -> PackResult:
    found, counts, bad = survey(parts, files)
    first, n = found[0], sum(s.n for s in found)
    if n == 0:
        raise EmptyDatasetError(
            f"the {len(parts)} parts hold no sample; every input was quarantined"
        )
    check_bad_fraction(n + len(bad), bad, max_bad_fraction)
    check_every_class(
        set(np.flatnonzero(counts.sum(axis=0)).tolist()), first.classes, f"the {len(parts)} parts"
    )
    attrs = root_attrs(
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
    # The copy checked what it wrote (each part file's sha256, or each sample's digest), so
    # the seal verifies structure only; the file's sha256 is computed when published.
    with staged(out_path, overwrite=overwrite, max_pixels=max_pixels, check_digests=False) as stage:
        assemble(stage, found, tmp_dir, bad, attrs, files)
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
