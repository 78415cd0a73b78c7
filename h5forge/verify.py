"""Verify an h5forge file: structure, counts, labels, byte ranges and per-sample digests.

Every check runs and every failure is collected, so one :class:`IntegrityError` lists all that is
wrong with a file (sample index, expected and actual). Sample digests and the whole-file sha256
are computed in one sequential pass over the file: the file hash runs in a helper thread on the
same buffer (hashlib releases the GIL), so a full verify costs about one read of the file.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import h5py
import numpy as np

from h5forge import format as fmt
from h5forge.access import AssetIndex, load_index, open_h5, url_to_fs
from h5forge.errors import IntegrityError

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
    lengths = {name: h5[name].shape[0] for name in
               (fmt.LABELS, fmt.SPLITS, fmt.PATHS, fmt.DIGESTS, fmt.BYTE_RANGES)}
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
        fails.append(f"quarantine has {q} (paths, reasons), num_quarantined says "
                     f"{hdr.num_quarantined}")
    for i in np.flatnonzero((idx.labels < 0) | (idx.labels >= hdr.num_classes))[:100]:
        fails.append(f"label {idx.labels[i]} out of range: file declares {hdr.num_classes} "
                     f"classes (0..{hdr.num_classes - 1}) in /labels[{i}]")
    for i in np.flatnonzero(idx.split_codes >= len(idx.split_names))[:100]:
        fails.append(f"split code {idx.split_codes[i]} out of range 0..{len(idx.split_names) - 1}"
                     f" in /splits[{i}]")
    config = h5.attrs.get(fmt.A_CONFIG_JSON, "")
    config = config.decode() if isinstance(config, bytes) else str(config)
    want_hash = hashlib.sha256(config.encode()).hexdigest()
    got_hash = str(h5.attrs.get(fmt.A_CONFIG_SHA256, ""))
    if got_hash != want_hash:
        fails.append(f"config_sha256 attribute is {got_hash}, sha256(config_json) is {want_hash}")


def _layout(h5: h5py.File, idx: AssetIndex, file_size: int, fails: list[str]) -> None:
    n = idx.header.num_samples
    images = h5[fmt.IMAGES]
    actual = np.zeros((max(n, 0), 2), np.uint64)
    if idx.header.storage == "array":
        def record(info: Any) -> None:
            if 0 <= info.chunk_offset[0] < n:
                actual[info.chunk_offset[0]] = (info.byte_offset, info.size)

        if images.shape[0]:
            images.id.chunk_iter(record)
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
                fails.append(f"sample {i}: /shapes says {tuple(idx.shapes[i])} = {want[i]} bytes,"
                             f" /offsets gives {actual[i, 1]}")
    if idx.byte_ranges.shape != actual.shape:
        return
    for i in np.flatnonzero(np.any(idx.byte_ranges != actual, axis=1))[:100]:
        fails.append(f"sample {i}: /byte_ranges says {tuple(int(x) for x in idx.byte_ranges[i])},"
                     f" the HDF5 layout says {tuple(int(x) for x in actual[i])}")
    ends = idx.byte_ranges[:, 0] + idx.byte_ranges[:, 1] if n else np.zeros(0, np.uint64)
    for i in np.flatnonzero(ends > np.uint64(file_size))[:100]:
        fails.append(f"sample {i}: byte range ends at {int(ends[i])}, past the end of the "
                     f"{file_size}-byte file (truncated?)")


def _stream(url: str, storage_options: dict[str, Any] | None, ranges: list[tuple[int, int, int]],
            on_sample: Callable[[int, bytes], None], on_bytes: Callable[[int], None]) -> str:
    """One sequential pass: returns the file sha256; calls ``on_sample(i, bytes)`` per range."""
    fs, path = url_to_fs(url, storage_options)
    file_hash = hashlib.sha256()
    ranges = sorted(ranges, key=lambda r: r[1])
    k, pos, pending = 0, 0, bytearray()
    with fs.open(path, "rb", block_size=_BLOCK, cache_type="none") as f, \
            ThreadPoolExecutor(1) as pool:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            hashing = pool.submit(file_hash.update, block)
            end = pos + len(block)
            while k < len(ranges) and ranges[k][1] < end:
                i, start, size = ranges[k]
                lo, hi = max(start, pos), min(start + size, end)
                pending += block[lo - pos:hi - pos]
                if start + size > end:
                    break
                on_sample(i, bytes(pending))
                pending.clear()
                k += 1
            hashing.result()
            on_bytes(len(block))
            pos = end
    return file_hash.hexdigest()


def _check_samples(url: str, storage_options: dict[str, Any] | None, h5_digests: np.ndarray,
                   idx: AssetIndex, chosen: list[int], filtered_reader: Callable[[int], bytes]
                   | None, fails: list[str], on_bytes: Callable[[int], None]) -> str:
    from h5forge.images import Encoding, decode_stored

    hdr = idx.header

    def check(i: int, data: bytes) -> None:
        got = hashlib.sha256(data).hexdigest()
        want = bytes(h5_digests[i]).hex()
        if got != want:
            fails.append(f"sample {i}: sha256 of stored bytes is {got}, /digests says {want}")
            return
        if hdr.layout == "encoded":
            shape = tuple(int(x) for x in idx.shapes[i]) if idx.shapes is not None else None
            try:
                arr = decode_stored(data, shape, layout=hdr.layout,
                                    encoding=cast(Encoding, hdr.encoding),
                                    mode=hdr.mode)
            except (OSError, ValueError, SyntaxError) as e:
                fails.append(f"sample {i}: encoded bytes do not decode: {e}")
                return
            if shape is not None and tuple(arr.shape) != shape:
                fails.append(f"sample {i}: decodes to {tuple(arr.shape)}, /shapes says {shape}")

    if filtered_reader is not None:
        for i in chosen:
            check(i, filtered_reader(i))
        return _stream(url, storage_options, [], lambda i, b: None, on_bytes)
    ranges = [(i, int(idx.byte_ranges[i, 0]), int(idx.byte_ranges[i, 1])) for i in chosen]
    seen: set[int] = set()

    def on_sample(i: int, data: bytes) -> None:
        seen.add(i)
        check(i, data)

    sha = _stream(url, storage_options, ranges, on_sample, on_bytes)
    for i in sorted(set(chosen) - seen)[:100]:
        fails.append(f"sample {i}: its byte range lies past the end of the file")
    return sha


def _verify(url: str, *, sample_fraction: float, seed: int,
            storage_options: dict[str, Any] | None, progress: bool,
            require_sealed: bool) -> VerifyReport:
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
            _layout(h5, idx, file_size, fails)
        digests = h5[fmt.DIGESTS][()]
        n = idx.header.num_samples
        chosen = list(range(n)) if sample_fraction >= 1.0 else sorted(
            random.Random(seed).sample(range(n), max(1, round(n * sample_fraction))))
        if fails:
            raise IntegrityError(f"{url} failed verification", fails)
        images = h5[fmt.IMAGES]
        filtered = None
        if idx.filtered:
            def filtered(i: int) -> bytes:
                return np.ascontiguousarray(images[i]).tobytes()

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

            sha = _check_samples(url, storage_options, digests, idx, chosen, filtered, fails,
                                 advance)
        finally:
            if bar is not None:
                bar.stop()
    if fails:
        raise IntegrityError(f"{url} failed verification", fails)
    return VerifyReport(path=url, num_samples=n, num_classes=idx.header.num_classes,
                        bytes=file_size, sha256=sha, checked_samples=len(chosen),
                        seconds=time.perf_counter() - t0,
                        format_version=idx.header.format_version)


def verify(path_or_url: str, *, sample_fraction: float = 1.0, seed: int = 0,
           storage_options: dict[str, Any] | None = None, progress: bool = False) -> VerifyReport:
    """Verify a sealed h5forge file, local or at any fsspec URL.

    Args:
        path_or_url: the file.
        sample_fraction: fraction of samples whose digest is recomputed (seeded random subset);
            structure, labels, byte ranges and the file sha256 are always checked in full.
        seed: seed of the subset.

    Returns:
        counts, bytes, the file's sha256 and the elapsed time.

    Raises:
        UnsealedFileError: ``.partial``, unsealed, or unknown format version.
        IntegrityError: every failing check, one line each.
    """
    url = str(path_or_url)
    fmt.refuse_partial(url)
    return _verify(url, sample_fraction=sample_fraction, seed=seed,
                   storage_options=storage_options, progress=progress, require_sealed=True)


def verify_unsealed(path: str) -> VerifyReport:
    """Verify a file the writer has not sealed yet (the writer's last step before sealing)."""
    return _verify(path, sample_fraction=1.0, seed=0, storage_options=None, progress=False,
                   require_sealed=False)
