"""Verify an h5forge file: structure, counts, labels, byte ranges and per-sample digests.

Every check runs and every failure is collected, so one :class:`IntegrityError` lists all that is
wrong with a file (sample index, expected and actual). The checks, in order: what a reader's
open refuses (:func:`h5forge.asset.index.load_index`, :func:`~h5forge.asset.index.check_index`),
labels and the attribute digests (:mod:`h5forge.verify.metadata`), byte ranges against the HDF5
layout (:mod:`h5forge.verify.layout`), then every chosen sample's digest and the whole-file
sha256 in one pass (:mod:`h5forge.verify.digests`), and their target columns
(:mod:`h5forge.verify.targets`). The writer's own check before sealing
(:func:`verify_unsealed`) skips the file hash and hashes samples on every CPU.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import check_index, load_index
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.errors import IntegrityError, StoreError
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.verify.digests import check_samples
from h5forge.verify.layout import check_layout
from h5forge.verify.metadata import check_metadata
from h5forge.verify.targets import check_targets

__all__ = ["VerifyReport", "verify", "verify_unsealed"]


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a successful :func:`verify`."""

    path: str
    num_samples: int
    num_classes: int
    bytes: int
    sha256: str
    checked_samples: int
    seconds: float
    format_version: int


def _verify(
    where: Location,
    *,
    sample_fraction: float,
    seed: int,
    progress: bool,
    require_sealed: bool,
    thorough: bool = True,
    check_digests: bool = True,
    max_pixels: int,
    own: bool = False,
) -> VerifyReport:
    if not 0.0 < sample_fraction <= 1.0:
        raise ValueError(f"sample_fraction={sample_fraction} must be in (0, 1]")
    t0 = time.perf_counter()
    url = where.url
    file_size = int(where.ask("its size", "size", where.path))
    fails: list[str] = []
    with open_h5(where) as h5:
        idx = load_index(h5, where=url, require_sealed=require_sealed)
        check_metadata(h5, idx, fails)
        if not fails:
            check_layout(h5, idx, file_size, fails, lookup=thorough)
        if not fails:  # what a reader refuses at open, verify refuses too
            check_index(idx, file_size, where=url, max_pixels=max_pixels)
        digests = h5[fmt.DIGESTS][()]
        n = idx.header.num_samples
        chosen = (
            list(range(n))
            if sample_fraction >= 1.0
            else sorted(random.Random(seed).sample(range(n), max(1, round(n * sample_fraction))))
        )
        if not fails:  # the target columns of the same samples (format version 2); the
            # caller's own check (check_digests=False) covers the images' bytes, not these
            check_targets(h5, idx.header, chosen, fails, decode=thorough, max_pixels=max_pixels)
        if not check_digests:  # the caller checked every sample's bytes as it wrote them
            chosen = []
        if fails:
            raise IntegrityError(f"{url} failed verification", fails)
        images = h5[fmt.IMAGES]
        filtered = None
        if idx.filtered:

            def filtered(i: int) -> bytes | None:
                try:
                    return np.ascontiguousarray(images[i]).tobytes()
                except OSError as e:  # fletcher32 mismatch, or the codec rejects the chunk
                    fails.append(
                        f"sample {i}: HDF5 cannot read its chunk ({e}): a checksum "
                        "(fletcher32) or decompression failure"
                    )
                    return None

        bar = None
        if progress:
            from rich.progress import Progress

            bar = Progress()
            bar.start()
            task = bar.add_task("verify", total=file_size)
        try:

            def advance(nbytes: int) -> None:
                if bar is not None:
                    bar.advance(task, nbytes)

            sha = check_samples(
                where,
                digests,
                idx,
                chosen,
                filtered,
                fails,
                advance,
                file_hash=thorough,
                decode=thorough,
                max_pixels=max_pixels,
                own=own,
            )
        finally:
            if bar is not None:
                bar.stop()
    if fails:
        raise IntegrityError(f"{url} failed verification", fails)
    return VerifyReport(
        path=url,
        num_samples=n,
        num_classes=idx.header.num_classes,
        bytes=file_size,
        sha256=sha,
        checked_samples=len(chosen),
        seconds=time.perf_counter() - t0,
        format_version=idx.header.format_version,
    )


def _damage_is_integrity(url: str, run: Callable[[], VerifyReport]) -> VerifyReport:
    """Run a verification; an error from reading a damaged file becomes an IntegrityError (a
    store that failed the reads is no damage: its StoreError passes as it is)."""
    try:
        return run()
    except (IntegrityError, FileNotFoundError, StoreError):
        raise
    except H5_DAMAGE as e:  # FileNotFoundError is re-raised above, as is
        if isinstance(e, ValueError) and "sample_fraction" in str(e):
            raise  # an argument error, not damage
        raise IntegrityError(
            f"{url} failed verification: the file is damaged",
            [f"reading its HDF5 structure failed: {type(e).__name__}: {e}"],
        ) from e


def verify(
    path_or_url: str | Location,
    *,
    sample_fraction: float = 1.0,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> VerifyReport:
    """Verify a sealed h5forge file, local or at any fsspec URL.

    Args:
        path_or_url: the file (a path, an fsspec URL or a :class:`~h5forge.location.Location`).
        storage_options: fsspec options of a URL string; never recorded.
        sample_fraction: fraction of samples whose digest is recomputed (seeded random subset);
            structure, labels, byte ranges and the file sha256 are always checked in full.
        seed: seed of the subset.
        max_pixels: most pixels one encoded sample may decode to (the check decodes every
            chosen one), and one compressed chunk may hold; default Pillow's limit,
            :data:`h5forge.preprocess.images.DEFAULT_MAX_PIXELS`. Never raised by the file's
            ``/shapes``.

    Before anything is read, the file's structure is checked as a reader's open checks it
    (links, virtual datasets, external storage, declared sizes; see docs/FORMAT.md, "What
    readers refuse").

    Returns:
        counts, bytes, the file's sha256 and the elapsed time.

    Raises:
        UnsealedFileError: ``.partial``, unsealed, or unknown format version.
        IntegrityError: every failing check, one line each.
    """
    where = Location.of(path_or_url, storage_options)
    url = where.url
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(
            f"max_pixels={max_pixels!r} must be an int >= 1; the default is {DEFAULT_MAX_PIXELS}"
        )
    fmt.refuse_partial(url)
    # A publish may replace the file while it is read (index from one version, bytes from the
    # next would fail as "corrupt"): verify again when the file changed identity meanwhile.
    for _ in range(_REPLACED_TRIES):
        before = _identity(where)
        try:
            report = _damage_is_integrity(
                url,
                lambda: _verify(
                    where,
                    sample_fraction=sample_fraction,
                    seed=seed,
                    progress=progress,
                    require_sealed=True,
                    max_pixels=max_pixels,
                ),
            )
        except IntegrityError:
            if _identity(where) != before:
                continue
            raise
        if _identity(where) == before:
            return report
    raise IntegrityError(
        f"{url} was replaced {_REPLACED_TRIES} times while it was being "
        "verified; verify it again once it is no longer being published"
    )


_REPLACED_TRIES = 3


def _identity(where: Location) -> tuple[object, ...]:
    """What changes when the file at ``where`` is replaced (inode and times; ETag remotely)."""
    fs, path = where.fs, where.path
    if where.is_local:
        st = os.stat(path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    fs.invalidate_cache(path)
    info = where.ask("its details", "info", path)
    return tuple(
        str(info.get(k))
        for k in ("size", "ETag", "etag", "LastModified", "mtime", "generation", "VersionId")
    )


def verify_unsealed(path: str, *, max_pixels: int, check_digests: bool = True) -> VerifyReport:
    """Verify a local file the writer has not sealed yet (the writer's last step before sealing).

    Every check of :func:`verify` but three that cannot fail here: the file's sha256 is not
    computed (sealing changes the file; ``sha256`` in the report is ``""``), encoded samples
    are not decoded again (the writer's workers decoded exactly these bytes, which the sample
    digests prove), and HDF5's chunk lookup is not repeated for every chunk (HDF5 built this
    file's chunk index moments ago; that check is for damage at rest, see
    :mod:`h5forge.verify.layout`). Sample digests are recomputed on every usable CPU at once,
    from the page cache's pages in place (``mmap``: the file is the writer's own, created
    exclusively and held under its lock).

    Args:
        path: the local unsealed file.
        max_pixels: the writer's own decode bound (its configuration's ``max_image_pixels``):
            an encoded sample's recorded ``H*W`` above it is refused, as :func:`verify` does.
            Never taken from the file, and never the default where the writer was given more.
        check_digests: False skips the per-sample sha256 pass of the images
            (``checked_samples`` is 0) and keeps every structural check and the target
            columns' digests and rules; for a writer that already checked the image bytes it
            wrote (:func:`h5forge.scale.merge.merge_parts`: each part's file sha256, or each
            sample's digest for parts without a sidecar; a pack copying stored samples).
    """
    return _damage_is_integrity(
        path,
        lambda: _verify(
            Location(path),
            sample_fraction=1.0,
            seed=0,
            progress=False,
            require_sealed=False,
            thorough=False,
            check_digests=check_digests,
            max_pixels=max_pixels,
            own=True,
        ),
    )
