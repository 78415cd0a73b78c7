"""Merge shard files into one h5forge file by copying stored bytes, never decoding.

Array storage copies every chunk as stored, so compressed chunks are not recompressed and raw
ones are not touched: unfiltered chunks go file to file in runs of up to 16 MiB (``pread`` /
``pwrite`` into chunks allocated when ``/images`` is created), filtered ones one by one
(``read_direct_chunk`` → ``write_direct_chunk``, the filter mask carried over). Blob storage
copies each shard's ``/images`` bytes into the output blob and rebases ``/offsets``. Digests,
labels, splits, paths and quarantine lists are concatenated.

The copy is checked as it goes: every sample's sha256 is computed from the bytes in hand (on
helper threads, while the next block is copied) and compared with its shard's digest. A
filtered chunk is decompressed for that (the digest covers the pixels), which is what bounds
the speed of a compressed merge. The output is then sealed after a structural verify (counts,
labels, metadata digest, byte ranges against the HDF5 layout) that does not hash the samples a
second time; fsync, seal, rename as :func:`h5forge.writer.pack` does.

The output has the writer's physical layout (:class:`h5forge._placement.Head`: the index at the
head of the file, the image bytes after it). Remote shards are downloaded one at a time.

Memory: image bytes stream in blocks (at most 48 MiB wait for their hash), per-sample index
arrays one shard at a time; only the quarantine list and, for array storage, the chunk
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

from h5forge import format as fmt
from h5forge._checked_copy import (
    CheckedCopy,
    chunk_ranges,
    copy_blob,
    copy_filtered,
    copy_raw,
)
from h5forge._placement import Head, _early
from h5forge.access import is_local, load_index, open_h5, url_to_fs
from h5forge.errors import EmptyDatasetError, IntegrityError
from h5forge.writer import (
    PackResult,
    _check_bad_fraction,
    _check_every_class,
    _filter_kwargs,
    _root_attrs,
    _seal,
)

__all__ = ["merge_shards"]

_ROWS = 1 << 20  # index rows handled at a time
# Root attributes every shard of one build must share.
_SAME = (fmt.A_LAYOUT, fmt.A_STORAGE, fmt.A_ENCODING, fmt.A_MODE, fmt.A_COMPRESSION,
         fmt.A_CONFIG_JSON)


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class _Shard:
    url: str
    n: int
    attrs: dict[str, str]
    classes: tuple[str, ...]
    split_names: tuple[str, ...]
    image_shape: tuple[int, ...]   # (H, W, C) for array storage, (B,) for blob storage
    filters: tuple[int, ...]       # HDF5 filter ids on /images


def _survey(urls: Sequence[str], options: dict[str, Any] | None
            ) -> tuple[list[_Shard], np.ndarray, list[tuple[str, str]]]:
    """Read every shard's header and index; refuse a mix; count samples per (split, class)."""
    shards: list[_Shard] = []
    counts = np.zeros(0, np.int64)
    bad: list[tuple[str, str]] = []
    for url in urls:
        fmt.refuse_partial(url)
        with open_h5(url, options) as h5:
            idx = load_index(h5, where=url)
            images = h5[fmt.IMAGES]
            plist = images.id.get_create_plist()
            shard = _Shard(
                url=url, n=idx.header.num_samples,
                attrs={k: _text(h5.attrs.get(k, "")) for k in _SAME},
                classes=idx.classes, split_names=idx.split_names,
                image_shape=tuple(int(x) for x in images.shape[1:]) if idx.header.storage
                == "array" else (int(images.shape[0]),),
                filters=tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters())))
            if shards:
                _same(shards[0], shard)
            else:
                counts = np.zeros(len(shard.split_names) * len(shard.classes), np.int64)
            k = len(shard.classes)
            codes = idx.split_codes.astype(np.int64) * k + idx.labels
            counts += np.bincount(codes, minlength=len(counts))[:len(counts)]
            if idx.header.num_quarantined:
                bad.extend(zip(h5[fmt.QUARANTINE_PATHS].asstr()[()].tolist(),
                               h5[fmt.QUARANTINE_REASONS].asstr()[()].tolist(), strict=True))
        shards.append(shard)
    return shards, counts.reshape(len(shards[0].split_names), len(shards[0].classes)), bad


def _same(first: _Shard, other: _Shard) -> None:
    pairs: list[tuple[str, object, object]] = [
        (f"root attribute {k}", first.attrs[k], other.attrs[k]) for k in _SAME]
    pairs += [("/classes", first.classes, other.classes),
              ("/split_names", first.split_names, other.split_names),
              ("/images filters", first.filters, other.filters)]
    if first.attrs[fmt.A_STORAGE] == "array":
        pairs.append(("image shape (H, W, C)", first.image_shape, other.image_shape))
    for what, a, b in pairs:
        if a != b:
            raise ValueError(
                f"shards disagree on {what}: {first.url} has {a!r}, {other.url} has {b!r}; "
                "every shard of one build must come from the same catalog and options — "
                "re-pack the odd ones")


@contextlib.contextmanager
def _local_copy(url: str, options: dict[str, Any] | None, tmp: str) -> Iterator[str]:
    """A local path for ``url``: itself when local, else a download deleted afterwards."""
    fs, path = url_to_fs(url, options)
    if is_local(fs):
        yield path
        return
    local = os.path.join(tmp, "shard.h5")
    fs.get_file(path, local)
    try:
        yield local
    finally:
        os.unlink(local)


def _images_kwargs(first: _Shard, n: int, blob_bytes: int) -> dict[str, Any]:
    """``create_dataset`` arguments of the output's ``/images``, as the writer makes them.

    Unfiltered chunks are allocated at creation (``H5D_ALLOC_TIME_EARLY``, in order, right
    after the head): their offsets are known before the first byte is copied, so the copy is
    plain ``pread``/``pwrite`` of whole runs of chunks instead of one HDF5 call per chunk.
    """
    if first.attrs[fmt.A_STORAGE] == "blob":
        return {"shape": (blob_bytes,), "dtype": np.uint8}
    config = json.loads(first.attrs[fmt.A_CONFIG_JSON])
    filters = _filter_kwargs(config["compression"], config["compression_level"],
                             config["fletcher32"])
    shape = first.image_shape
    early = {} if filters else {"dcpl": _early(False)}
    return {"shape": (n, *shape), "maxshape": (None, *shape), "dtype": np.uint8,
            "chunks": (1, *shape), **filters, **early}


def _filter_ids(images: h5py.Dataset) -> tuple[int, ...]:
    plist = images.id.get_create_plist()
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def _byte_ranges(head: Head, n: int, blob: bool) -> None:
    images, out = head.images, head.ds[fmt.BYTE_RANGES]
    if blob:
        base = np.uint64(images.id.get_offset() or 0)
        for lo in range(0, n, _ROWS):
            off = head.ds[fmt.OFFSETS][lo:min(n, lo + _ROWS) + 1]
            out[lo:lo + len(off) - 1] = np.stack([off[:-1] + base, np.diff(off)], axis=1)
        return
    out[...] = chunk_ranges(images, n).astype(np.uint64)


def _write(partial: str, shards: list[_Shard], options: dict[str, Any] | None, tmp: str,
           bad: list[tuple[str, str]], attrs: dict[str, Any]) -> None:
    first = shards[0]
    n = sum(s.n for s in shards)
    blob = first.attrs[fmt.A_STORAGE] == "blob"
    raw = not blob and not first.filters
    blob_bytes = sum(s.image_shape[0] for s in shards) if blob else 0
    with contextlib.ExitStack() as stack:
        h5 = stack.enter_context(h5py.File(partial, "w"))
        # The same physical layout as the writer's: index at the head, image bytes after it.
        head = Head(h5, attrs, storage=cast(fmt.Storage, first.attrs[fmt.A_STORAGE]),
                    capacity=n, classes=first.classes, split_names=first.split_names,
                    images=_images_kwargs(first, n, blob_bytes))
        ds, images = head.ds, head.images
        if _filter_ids(images) != first.filters:
            raise ValueError(f"config_json of {first.url} gives /images filters "
                             f"{_filter_ids(images)}, the shard has {first.filters}; the shard "
                             "is inconsistent, re-pack it")
        out = os.open(partial, os.O_WRONLY)
        stack.callback(os.close, out)
        dst = chunk_ranges(images, n) if raw else None  # allocated at creation
        blob_offset = (images.id.get_offset() or 0) if blob else 0
        check = stack.enter_context(CheckedCopy())
        # Written pages start going to disk while later shards are copied, so the fsync
        # before the seal finds little left to do.
        flusher = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="h5forge-sync"))
        flushing: Future[None] | None = None
        base, pos = 0, 0
        for shard in shards:
            if shard.n == 0:  # every input of it was quarantined
                continue
            with _local_copy(shard.url, options, tmp) as local, h5py.File(local, "r") as src:
                stop = base + shard.n
                digests = src[fmt.DIGESTS][()]
                ds[fmt.DIGESTS][base:stop] = digests
                for name in (fmt.LABELS, fmt.SPLITS):
                    ds[name][base:stop] = src[name][()]
                ds[fmt.PATHS][base:stop] = src[fmt.PATHS].asstr()[()].astype(object)

                def label(j: int, base: int = base, url: str = shard.url) -> str:
                    return f"sample {base + j} (sample {j} of {url})"

                if blob:
                    offsets = src[fmt.OFFSETS][()]
                    ds[fmt.OFFSETS][base + 1:stop + 1] = offsets[1:] + np.uint64(pos)
                    ds[fmt.SHAPES][base:stop] = src[fmt.SHAPES][()]
                    pos += copy_blob(check, local, src[fmt.IMAGES], out, blob_offset + pos,
                                      offsets, digests, label)
                elif dst is not None:
                    with open(local, "rb", buffering=0) as f:
                        copy_raw(check, f.fileno(), src[fmt.IMAGES], out, dst[base:stop],
                                  digests, label)
                else:
                    copy_filtered(check, src[fmt.IMAGES], images, base, digests, label,
                                   first.filters)
            if check.failures:  # stop at the first damaged shard
                break
            base = stop
            if flushing is None or flushing.done():
                flushing = flusher.submit(os.fdatasync, out)
        failures = check.wait()
        if failures:
            raise IntegrityError(
                f"merging into {partial}: {len(failures)} sample(s) do not match the digests "
                "their shard recorded, so a shard changed after it was packed; run the build "
                "again (find_done_shards re-packs shards whose file no longer matches their "
                "manifest) or re-pack the shards named below", failures[:100])
        if blob:
            ds[fmt.OFFSETS][0] = 0
        if dst is not None:
            ds[fmt.BYTE_RANGES][...] = dst.astype(np.uint64)
        else:
            _byte_ranges(head, n, blob)
        for name, col in ((fmt.QUARANTINE_PATHS, 0), (fmt.QUARANTINE_REASONS, 1)):
            if bad:
                ds[name].resize(len(bad), axis=0)
                ds[name][...] = np.array([q[col] for q in bad], dtype=object)
        h5.flush()  # _seal() fsyncs it while it verifies
        if flushing is not None:
            flushing.result()


def merge_shards(shards: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                 max_bad_fraction: float = 0.01, source_url: str = "", source_sha256: str = "",
                 storage_options: Mapping[str, Any] | None = None, overwrite: bool = False,
                 tmp_dir: str | os.PathLike[str] | None = None) -> PackResult:
    """Merge sealed shard files, in the given order, into one sealed file at ``out``.

    Args:
        shards: shard files (local paths or fsspec URLs), in sample order.
        out: local path of the merged ``.h5``.
        max_bad_fraction: fail when more than this fraction of all inputs (packed plus
            quarantined, over every shard) was quarantined.
        source_url, source_sha256: recorded as root attributes (redact the URL first).
        storage_options: for remote shard URLs; remote shards are downloaded one at a time.
        overwrite: replace an existing ``out``.
        tmp_dir: local scratch folder for downloaded shards; default the system's.

    Returns:
        The same summary :func:`h5forge.writer.pack` returns.

    Raises:
        ValueError: no shards, or shards that disagree (configuration, classes, splits,
            storage, image shape, filters).
        UnsealedFileError: a shard is ``.partial``, unsealed or of an unknown version.
        TooManyBadImagesError: too many inputs were quarantined in total.
        EmptyDatasetError: a class has no packed sample in any shard.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    t0 = time.perf_counter()
    urls = [os.fspath(s) for s in shards]
    if not urls:
        raise ValueError("no shards to merge; pack them first with h5forge.shards.pack_shard")
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ValueError(f"max_bad_fraction={max_bad_fraction} must be between 0 and 1")
    out_path = Path(out)
    if out_path.suffix == fmt.PARTIAL_SUFFIX:
        raise ValueError(f"output {out} must not end in {fmt.PARTIAL_SUFFIX}")
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True to replace it")
    options = dict(storage_options) if storage_options else None
    found, counts, bad = _survey(urls, options)
    first, n = found[0], sum(s.n for s in found)
    if n == 0:
        raise EmptyDatasetError(f"the {len(urls)} shards hold no sample; every input was "
                                "quarantined")
    _check_bad_fraction(n + len(bad), bad, max_bad_fraction)
    _check_every_class(set(np.flatnonzero(counts.sum(axis=0)).tolist()), first.classes,
                       f"the {len(urls)} shards")
    attrs = _root_attrs(
        layout=first.attrs[fmt.A_LAYOUT], storage=first.attrs[fmt.A_STORAGE],
        encoding=first.attrs[fmt.A_ENCODING], mode=first.attrs[fmt.A_MODE],
        config_json=first.attrs[fmt.A_CONFIG_JSON], source_url=source_url,
        source_sha256=source_sha256, num_samples=n, num_classes=len(first.classes),
        num_quarantined=len(bad), compression=first.attrs[fmt.A_COMPRESSION])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = str(out_path) + fmt.PARTIAL_SUFFIX
    try:
        with tempfile.TemporaryDirectory(prefix="h5forge-merge-", dir=tmp_dir) as tmp:
            _write(partial, found, options, tmp, bad, attrs)
        # The copy checked every sample's digest from the bytes it wrote (see _write), so the
        # seal verifies structure only; the file's sha256 is computed when it is published.
        _seal(partial, out_path, check_digests=False)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    split_keys = [s if s else "" for s in first.split_names]
    per_split = {split_keys[i]: {first.classes[k]: int(c) for k, c in enumerate(row) if c}
                 for i, row in enumerate(counts) if row.any()}
    return PackResult(path=str(out_path), num_samples=n, num_quarantined=len(bad),
                      num_classes=len(first.classes), classes=first.classes,
                      quarantined=tuple(bad), bytes=out_path.stat().st_size,
                      seconds=time.perf_counter() - t0, counts=per_split)
