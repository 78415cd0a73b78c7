"""Verify an h5forge file: structure, counts, labels, byte ranges and per-sample digests.

Every check runs and every failure is collected, so one :class:`IntegrityError` lists all that is
wrong with a file (sample index, expected and actual). Sample digests and the whole-file sha256
are computed in one sequential pass over the file: the file hash runs in a helper thread on the
same buffer (hashlib releases the GIL) while this thread hashes the samples in it, so a full
verify costs about one sha256 of the file on two cores. The writer's own check before sealing
(:func:`verify_unsealed`) skips the file hash and hashes samples on every CPU.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.access import (
    H5_DAMAGE,
    AssetIndex,
    check_index,
    is_local,
    load_index,
    open_h5,
    url_to_fs,
)
from h5forge.asset.chunks import chunk_ranges
from h5forge.cpus import usable_cpus
from h5forge.errors import IntegrityError
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS

__all__ = ["VerifyReport", "verify", "verify_unsealed"]

_BLOCK = 8 << 20


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


def _structure(h5: h5py.File, idx: AssetIndex, fails: list[str]) -> None:
    n, hdr = idx.header.num_samples, idx.header
    lengths = {
        name: h5[name].shape[0]
        for name in (fmt.LABELS, fmt.SPLITS, fmt.PATHS, fmt.DIGESTS, fmt.BYTE_RANGES)
    }
    images = h5[fmt.IMAGES]
    if images.dtype != np.uint8:
        fails.append(f"/images dtype is {images.dtype}, expected uint8")
    if hdr.storage == "array":
        lengths[fmt.IMAGES] = images.shape[0]
        if images.ndim != 4 or images.shape[3] != hdr.channels:
            fails.append(f"/images shape {images.shape}, expected (N, H, W, {hdr.channels})")
    else:
        lengths[fmt.SHAPES] = h5[fmt.SHAPES].shape[0]
        lengths[fmt.OFFSETS + " - 1"] = h5[fmt.OFFSETS].shape[0] - 1
    for name, got in lengths.items():
        if got != n:
            fails.append(f"/{name} has {got} rows, root attribute num_samples says {n}")
    for name, want in ((fmt.DIGESTS, (n, fmt.DIGEST_SIZE)), (fmt.BYTE_RANGES, (n, 2))):
        if h5[name].shape != want:
            fails.append(f"/{name} shape {h5[name].shape}, expected {want}")
    if len(idx.classes) != hdr.num_classes:
        fails.append(f"/classes has {len(idx.classes)} names, num_classes says {hdr.num_classes}")
    q = (h5[fmt.QUARANTINE_PATHS].shape[0], h5[fmt.QUARANTINE_REASONS].shape[0])
    if q != (hdr.num_quarantined, hdr.num_quarantined):
        fails.append(
            f"quarantine has {q} (paths, reasons), num_quarantined says {hdr.num_quarantined}"
        )
    for i in np.flatnonzero((idx.labels < 0) | (idx.labels >= hdr.num_classes))[:100]:
        fails.append(
            f"label {idx.labels[i]} out of range: file declares {hdr.num_classes} "
            f"classes (0..{hdr.num_classes - 1}) in /labels[{i}]"
        )
    for i in np.flatnonzero(idx.split_codes >= len(idx.split_names))[:100]:
        fails.append(
            f"split code {idx.split_codes[i]} out of range 0..{len(idx.split_names) - 1}"
            f" in /splits[{i}]"
        )
    config = h5.attrs.get(fmt.A_CONFIG_JSON, "")
    config = config.decode() if isinstance(config, bytes) else str(config)
    want_hash = hashlib.sha256(config.encode("utf-8", "surrogateescape")).hexdigest()
    got_hash = str(h5.attrs.get(fmt.A_CONFIG_SHA256, ""))
    if got_hash != want_hash:
        fails.append(f"config_sha256 attribute is {got_hash}, sha256(config_json) is {want_hash}")
    got_meta = h5.attrs.get(fmt.A_METADATA_SHA256)
    want_meta = fmt.metadata_sha256(h5)
    if got_meta is None:
        fails.append(
            f"root attribute {fmt.A_METADATA_SHA256} is missing: the attributes, labels,"
            " paths and class names cannot be checked; re-pack the file"
        )
    elif str(got_meta) != want_meta:
        fails.append(
            f"{fmt.A_METADATA_SHA256} attribute is {got_meta}, the root attributes and "
            f"index datasets hash to {want_meta}: an attribute, label, offset, path, "
            "class name or quarantine entry changed"
        )


def _layout(
    h5: h5py.File, idx: AssetIndex, file_size: int, fails: list[str], *, lookup: bool = True
) -> None:
    n = idx.header.num_samples
    images = h5[fmt.IMAGES]
    actual = np.zeros((max(n, 0), 2), np.uint64)
    if idx.header.storage == "array":
        found = chunk_ranges(images, n)
        actual[found[:, 0] >= 0] = found[found[:, 0] >= 0]
        if lookup and not idx.filtered and h5.driver != "fileobj":
            _lookup(images, n, actual, fails)
    else:
        offsets = h5[fmt.OFFSETS][()].astype(np.uint64)
        steps = np.diff(offsets.astype(np.int64))
        if len(offsets) != n + 1 or offsets[0] != 0 or np.any(steps < 0):
            fails.append("/offsets must start at 0 and never decrease")
            return
        if int(offsets[-1]) != images.shape[0]:
            fails.append(f"/offsets ends at {int(offsets[-1])}, /images holds {images.shape[0]}")
        base = np.uint64(images.id.get_offset() or 0)
        actual = np.stack([offsets[:-1] + base, np.diff(offsets)], axis=1)
        if idx.header.layout == "decoded" and idx.shapes is not None:
            want = np.prod(idx.shapes.astype(np.uint64), axis=1)
            for i in np.flatnonzero(want != actual[:, 1])[:100]:
                fails.append(
                    f"sample {i}: /shapes says {tuple(idx.shapes[i])} = {want[i]} bytes,"
                    f" /offsets gives {actual[i, 1]}"
                )
    if idx.byte_ranges.shape != actual.shape:
        return
    for i in np.flatnonzero(np.any(idx.byte_ranges != actual, axis=1))[:100]:
        fails.append(
            f"sample {i}: /byte_ranges says {tuple(int(x) for x in idx.byte_ranges[i])},"
            f" the HDF5 layout says {tuple(int(x) for x in actual[i])}"
        )
    ends = idx.byte_ranges[:, 0] + idx.byte_ranges[:, 1] if n else np.zeros(0, np.uint64)
    for i in np.flatnonzero(ends > np.uint64(file_size))[:100]:
        fails.append(
            f"sample {i}: byte range ends at {int(ends[i])}, past the end of the "
            f"{file_size}-byte file (truncated?)"
        )


class _Hasher:
    """Hashes sample byte ranges from consecutive blocks of one pass over (part of) a file."""

    def __init__(
        self,
        ranges: list[tuple[int, int, int]],
        want_data: bool,
        on_sample: Callable[[int, bytes, bytes | None], None],
    ) -> None:
        self.ranges, self.want_data, self.on_sample = ranges, want_data, on_sample
        self.k = 0
        self.partial: Any = None  # running sha256 of a sample that continues in the next block
        self.pending = bytearray()

    def feed(self, pos: int, view: memoryview) -> None:
        """Hash every sample (part) inside ``view``, the file's bytes from ``pos``."""
        end = pos + len(view)
        ranges = self.ranges
        while self.k < len(ranges) and ranges[self.k][1] < end:
            i, start, size = ranges[self.k]
            lo, hi = max(start, pos), min(start + size, end)
            part = view[lo - pos : hi - pos]
            if self.partial is None:
                self.partial = hashlib.sha256(part)  # no copy; releases the GIL on large parts
            else:
                self.partial.update(part)
            if self.want_data:
                self.pending += part
            if start + size > end:
                return
            self.on_sample(
                i, self.partial.digest(), bytes(self.pending) if self.want_data else None
            )
            self.partial = None
            self.pending.clear()
            self.k += 1


def _stream(
    url: str,
    storage_options: dict[str, Any] | None,
    ranges: list[tuple[int, int, int]],
    on_sample: Callable[[int, bytes, bytes | None], None],
    on_bytes: Callable[[int], None],
    *,
    want_data: bool,
) -> str:
    """One sequential pass: returns the file sha256; ``on_sample(i, sha256, bytes)`` per range.

    The file hash runs on a helper thread over the block just read while this thread hashes the
    samples in it (hashlib releases the GIL), with two buffers so reading never waits for
    either: a full verify costs about one sha256 of the file on two cores.
    """
    fs, path = url_to_fs(url, storage_options)
    file_hash = hashlib.sha256()
    hasher = _Hasher(sorted(ranges, key=lambda r: r[1]), want_data, on_sample)
    buffers = [bytearray(_BLOCK), bytearray(_BLOCK)]
    busy: list[Future[None] | None] = [None, None]
    pos, b = 0, 0
    with (
        fs.open(path, "rb", block_size=_BLOCK, cache_type="none") as f,
        ThreadPoolExecutor(1) as pool,
    ):
        while True:
            hashing = busy[b]
            if hashing is not None:
                hashing.result()  # the helper is done with this buffer
            n = f.readinto(buffers[b])
            if not n:
                break
            view = memoryview(buffers[b])[:n]
            busy[b] = pool.submit(file_hash.update, view)
            hasher.feed(pos, view)
            on_bytes(n)
            pos += n
            b ^= 1
        for hashing in busy:
            if hashing is not None:
                hashing.result()
    return file_hash.hexdigest()


def _scan_parallel(
    path: str,
    ranges: list[tuple[int, int, int]],
    on_sample: Callable[[int, bytes, bytes | None], None],
    on_bytes: Callable[[int], None],
) -> None:
    """Hash the samples of a local file without the file hash, on every usable CPU."""
    ranges = sorted(ranges, key=lambda r: r[1])
    threads = max(
        1,
        min(
            usable_cpus(),
            8,
            len(ranges),
        ),
    )
    total = sum(r[2] for r in ranges)
    groups: list[list[tuple[int, int, int]]] = [[]]
    acc = 0
    for r in ranges:  # contiguous runs of about equal bytes, one per thread
        if acc >= total * len(groups) / threads and len(groups) < threads:
            groups.append([])
        groups[-1].append(r)
        acc += r[2]

    def run(group: list[tuple[int, int, int]]) -> None:
        if not group:
            return
        hasher = _Hasher(group, False, on_sample)
        buf = bytearray(_BLOCK)
        pos, stop = group[0][1], group[-1][1] + group[-1][2]
        fd = os.open(path, os.O_RDONLY)
        try:
            while pos < stop:
                n = os.preadv(fd, [memoryview(buf)[: min(_BLOCK, stop - pos)]], pos)
                if not n:
                    break  # past the end: the caller reports the samples never seen
                hasher.feed(pos, memoryview(buf)[:n])
                on_bytes(n)
                pos += n
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(run, g) for g in groups]:
            done.result()


def _check_samples(
    url: str,
    storage_options: dict[str, Any] | None,
    h5_digests: np.ndarray,
    idx: AssetIndex,
    chosen: list[int],
    filtered_reader: Callable[[int], bytes | None] | None,
    fails: list[str],
    on_bytes: Callable[[int], None],
    *,
    file_hash: bool,
    decode: bool,
    max_pixels: int,
) -> str:
    """Check the digest of every chosen sample (and, with ``decode``, that encoded ones decode).

    Returns the file's sha256, or ``""`` without ``file_hash``: then a local file's samples are
    hashed on every usable CPU at once instead of in one sequential pass.
    """
    from h5forge.preprocess.images import Encoding, decode_stored

    hdr = idx.header
    decode = decode and hdr.layout == "encoded"
    found: list[tuple[int, str]] = []  # (sample, failure): sorted at the end, threads race
    seen: set[int] = set()

    def check_decode(i: int, data: bytes) -> None:
        shape = tuple(int(x) for x in idx.shapes[i]) if idx.shapes is not None else None
        try:
            arr = decode_stored(
                data,
                shape,
                layout=hdr.layout,
                encoding=cast(Encoding, hdr.encoding),
                mode=hdr.mode,
                max_pixels=max_pixels,
            )
        except (OSError, ValueError, SyntaxError) as e:
            found.append((i, f"sample {i}: encoded bytes do not decode: {e}"))
            return
        if shape is not None and tuple(arr.shape) != shape:
            found.append((i, f"sample {i}: decodes to {tuple(arr.shape)}, /shapes says {shape}"))

    cpus = usable_cpus()
    with ThreadPoolExecutor(cpus if decode else 1) as decoders:  # Pillow releases the GIL
        decoding: deque[Future[None]] = deque()

        def on_sample(i: int, digest: bytes, data: bytes | None) -> None:
            seen.add(i)
            want = bytes(h5_digests[i])
            if digest != want:
                found.append(
                    (
                        i,
                        f"sample {i}: sha256 of stored bytes is {digest.hex()}, "
                        f"/digests says {want.hex()}",
                    )
                )
                return
            if decode:
                assert data is not None
                decoding.append(decoders.submit(check_decode, i, data))
                while len(decoding) > 2 * cpus:
                    decoding.popleft().result()

        fs, path = url_to_fs(url, storage_options)
        ranges = [(i, int(idx.byte_ranges[i, 0]), int(idx.byte_ranges[i, 1])) for i in chosen]
        if filtered_reader is not None:
            for i in chosen:
                data = filtered_reader(i)
                if data is not None:  # None: unreadable, already listed in ``fails``
                    on_sample(i, hashlib.sha256(data).digest(), data)
            ranges = []
        if file_hash or not is_local(fs):
            sha = _stream(url, storage_options, ranges, on_sample, on_bytes, want_data=decode)
            sha = sha if file_hash else ""
        else:
            _scan_parallel(path, ranges, on_sample, on_bytes)
            sha = ""
        for pending in decoding:
            pending.result()
    if filtered_reader is None:
        found += [
            (i, f"sample {i}: its byte range lies past the end of the file")
            for i in sorted(set(chosen) - seen)[:100]
        ]
    fails.extend(msg for _, msg in sorted(found, key=lambda f: f[0]))
    return sha


def _verify(
    url: str,
    *,
    sample_fraction: float,
    seed: int,
    storage_options: dict[str, Any] | None,
    progress: bool,
    require_sealed: bool,
    thorough: bool = True,
    check_digests: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> VerifyReport:
    if not 0.0 < sample_fraction <= 1.0:
        raise ValueError(f"sample_fraction={sample_fraction} must be in (0, 1]")
    t0 = time.perf_counter()
    fs, path = url_to_fs(url, storage_options)
    file_size = int(fs.size(path))
    fails: list[str] = []
    with open_h5(url, storage_options) as h5:
        idx = load_index(h5, where=url, require_sealed=require_sealed)
        _structure(h5, idx, fails)
        if not fails:
            _layout(h5, idx, file_size, fails, lookup=thorough)
        if not fails:  # what a reader refuses at open, verify refuses too
            check_index(idx, file_size, where=url, max_pixels=max_pixels)
        digests = h5[fmt.DIGESTS][()]
        n = idx.header.num_samples
        chosen = (
            list(range(n))
            if sample_fraction >= 1.0
            else sorted(random.Random(seed).sample(range(n), max(1, round(n * sample_fraction))))
        )
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

            sha = _check_samples(
                url,
                storage_options,
                digests,
                idx,
                chosen,
                filtered,
                fails,
                advance,
                file_hash=thorough,
                decode=thorough,
                max_pixels=max_pixels,
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
    """Run a verification; an error from reading a damaged file becomes an IntegrityError."""
    try:
        return run()
    except (IntegrityError, FileNotFoundError):
        raise
    except H5_DAMAGE as e:  # FileNotFoundError is re-raised above, as is
        if isinstance(e, ValueError) and "sample_fraction" in str(e):
            raise  # an argument error, not damage
        raise IntegrityError(
            f"{url} failed verification: the file is damaged",
            [f"reading its HDF5 structure failed: {type(e).__name__}: {e}"],
        ) from e


def _lookup(images: h5py.Dataset, n: int, actual: np.ndarray, fails: list[str]) -> None:
    """Every chunk must be found by HDF5's own lookup too, not only by iterating the index.

    h5py and other HDF5 readers find a chunk by searching the chunk index's keys; iterating it
    (``chunk_iter``, what the byte ranges are checked against) does not read every key field. A
    damaged key hides the chunk from the search, and those readers silently get the fill value
    (zeros) for the sample. Local files only: reading every chunk again costs a second pass
    over the images, cheap from the page cache, a second download remotely.
    """
    rank = len(images.shape)
    # Not get_chunk_info_by_coord: HDF5 implements it by iterating the whole index (O(N) per
    # call, O(N^2) here), and iterating is not the search whose keys this check is about.
    for i in range(min(n, images.shape[0])):
        try:
            _, data = images.id.read_direct_chunk((i,) + (0,) * (rank - 1))
        except (OSError, RuntimeError, ValueError) as e:
            fails.append(
                f"sample {i}: HDF5's chunk lookup does not find it ({e}); h5py and "
                "other HDF5 readers would read zeros: the chunk index is damaged"
            )
        else:
            if len(data) != int(actual[i, 1]):
                fails.append(
                    f"sample {i}: HDF5's chunk lookup finds {len(data)} bytes, the "
                    f"chunk index lists {int(actual[i, 1])}"
                )
        if len(fails) >= 100:
            return


def verify(
    path_or_url: str,
    *,
    sample_fraction: float = 1.0,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    progress: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> VerifyReport:
    """Verify a sealed h5forge file, local or at any fsspec URL.

    Args:
        path_or_url: the file.
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
    url = str(path_or_url)
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(
            f"max_pixels={max_pixels!r} must be an int >= 1; the default is {DEFAULT_MAX_PIXELS}"
        )
    fmt.refuse_partial(url)
    # A publish may replace the file while it is read (index from one version, bytes from the
    # next would fail as "corrupt"): verify again when the file changed identity meanwhile.
    for _ in range(_REPLACED_TRIES):
        before = _identity(url, storage_options)
        try:
            report = _damage_is_integrity(
                url,
                lambda: _verify(
                    url,
                    sample_fraction=sample_fraction,
                    seed=seed,
                    storage_options=storage_options,
                    progress=progress,
                    require_sealed=True,
                    max_pixels=max_pixels,
                ),
            )
        except IntegrityError:
            if _identity(url, storage_options) != before:
                continue
            raise
        if _identity(url, storage_options) == before:
            return report
    raise IntegrityError(
        f"{url} was replaced {_REPLACED_TRIES} times while it was being "
        "verified; verify it again once it is no longer being published"
    )


_REPLACED_TRIES = 3


def _identity(url: str, storage_options: dict[str, Any] | None) -> tuple[object, ...]:
    """What changes when the file at ``url`` is replaced (inode and times; ETag remotely)."""
    fs, path = url_to_fs(url, storage_options)
    if is_local(fs):
        st = os.stat(path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    fs.invalidate_cache(path)
    info = fs.info(path)
    return tuple(
        str(info.get(k))
        for k in ("size", "ETag", "etag", "LastModified", "mtime", "generation", "VersionId")
    )


def verify_unsealed(path: str, *, check_digests: bool = True) -> VerifyReport:
    """Verify a local file the writer has not sealed yet (the writer's last step before sealing).

    Every check of :func:`verify` but three that cannot fail here: the file's sha256 is not
    computed (sealing changes the file; ``sha256`` in the report is ``""``), encoded samples
    are not decoded again (the writer's workers decoded exactly these bytes, which the sample
    digests prove), and HDF5's chunk lookup is not repeated for every chunk (HDF5 built this
    file's chunk index moments ago; that check is for damage at rest, see ``_lookup``).
    Sample digests are recomputed on every usable CPU at once.

    Args:
        path: the local unsealed file.
        check_digests: False skips the per-sample sha256 pass (``checked_samples`` is 0) and
            keeps every structural check; for a writer that already checked the bytes it
            wrote (:func:`h5forge.scale.merge.merge_shards`: each shard's file sha256, or each
            sample's digest for shards without a manifest).
    """
    return _damage_is_integrity(
        path,
        lambda: _verify(
            path,
            sample_fraction=1.0,
            seed=0,
            storage_options=None,
            progress=False,
            require_sealed=False,
            thorough=False,
            check_digests=check_digests,
        ),
    )
