"""Campaign 2 — corruption: flip one random byte of a sealed file, or truncate it, and verify.

Four files cover every storage: decoded ``array`` (unfiltered), decoded ``array`` with gzip and
fletcher32, encoded ``blob`` (original bytes) and decoded ``blob`` (``resize="none"``). Each has
splits, three classes, a quarantined input, a source URL and a source sha256, so every dataset
and attribute holds something.

The bytes of a file are split into regions — ``sample`` (the byte ranges of the samples),
``index`` (labels, offsets, shapes, byte_ranges, digests, splits), ``strings`` (paths, class
names, split names, quarantine entries, in HDF5's global heap), ``attributes`` (root attribute
names and values) and ``hdf5-metadata`` (everything else: superblock, object headers, B-trees,
heaps, free space, padding) — and each trial picks a region, then a byte in it, then XORs it with
a random non-zero mask. ``h5forge.verify.checks.verify`` must raise ``IntegrityError``. When it
passes,
everything readable (every attribute, every dataset with its type, shape and filters, every
image) is compared with the pristine file: identical means the flip hit bytes nothing reads
(``benign``); anything else is a silent corruption (``lost``).

Sample-region flips also go through ``H5ImageDataset``: without ``verify_reads`` the sample reads
back wrong (counted, that is the documented behaviour), with it an ``IntegrityError`` names the
sample. Truncations at random lengths must raise ``IntegrityError`` (or its subclass
``UnsealedFileError``) from ``verify`` and from the reader, never a raw h5py ``OSError``.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.reliability._result import CampaignResult

__all__ = ["REGIONS", "VARIANTS", "make_assets", "regions", "run", "snapshot"]

REGIONS = ("sample", "index", "strings", "attributes", "hdf5-metadata")
_INDEX = (fmt.LABELS, fmt.OFFSETS, fmt.SHAPES, fmt.BYTE_RANGES, fmt.DIGESTS, fmt.SPLITS)
_STRINGS = (fmt.PATHS, fmt.CLASSES, fmt.SPLIT_NAMES, fmt.QUARANTINE_PATHS, fmt.QUARANTINE_REASONS)


@dataclass(frozen=True)
class Variant:
    """One way of packing the campaign's source folder."""

    name: str
    image: ImageConfig
    compression: str | None = None
    fletcher32: bool = False


VARIANTS = (
    Variant("decoded-array", ImageConfig(resize="resize", size=(24, 32))),
    Variant("gzip-fletcher32", ImageConfig(resize="resize", size=(24, 32)), "gzip", True),
    Variant("encoded-blob", ImageConfig(layout="encoded", resize="none", size=None)),
    Variant("decoded-blob", ImageConfig(resize="none", size=None)),
)


def make_assets(work: Path, variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Path]:
    """Pack the campaign's small source folder once per variant; returns name -> sealed file."""
    src = work / "source"
    if not src.exists():
        write_image_folder(
            src,
            classes=("cat", "dog", "eel"),
            per_class=4,
            splits=("train", "val"),
            seed=5,
            size=((16, 40), (16, 40)),
        )
        (src / "train" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    out = {}
    for v in variants:
        path = work / f"{v.name}.h5"
        if not path.exists():
            pack(
                src,
                path,
                config=PackConfig(
                    v.image,
                    compression=v.compression,
                    fletcher32=v.fletcher32,
                ),
                workers=1,
                max_bad_fraction=0.2,
                source_url="https://example.org/data.tar.gz",
                source_sha256="ab" * 32,
            )
        out[v.name] = path
    return out


# --------------------------------------------------------------------------- regions


def _heap_spans(data: bytes, value: bytes) -> list[tuple[int, int]]:
    """Where a variable-length string's bytes lie: after its 8-byte size in a heap object."""
    if not value:
        return []
    needle = struct.pack("<Q", len(value)) + value
    spans, start = [], 0
    while (pos := data.find(needle, start)) >= 0:
        spans.append((pos + 8, pos + 8 + len(value)))
        start = pos + 1
    return spans


def _dataset_spans(data: bytes, ds: h5py.Dataset) -> list[tuple[int, int]]:
    """Where a numeric dataset's bytes lie: contiguous, chunked, or compact (in its header)."""
    if ds.id.get_offset() is not None:
        off = int(ds.id.get_offset())
        return [(off, off + int(ds.id.get_storage_size()))]
    if ds.chunks is not None:
        spans: list[tuple[int, int]] = []
        if ds.shape[0]:
            ds.id.chunk_iter(lambda c: spans.append((c.byte_offset, c.byte_offset + c.size)))
        return spans
    blob = np.ascontiguousarray(ds[()]).tobytes()
    at = data.find(blob) if blob else -1
    return [(at, at + len(blob))] if at >= 0 else []


def _attr_spans(data: bytes, h5: h5py.File) -> list[tuple[int, int]]:
    spans = []
    for name in h5.attrs:
        raw = name.encode() + b"\x00"
        pos = data.find(raw)
        if pos < 0:
            continue
        spans.append((pos, pos + len(raw)))
        value = h5.attrs[name]
        if isinstance(value, str):
            spans += _heap_spans(data, value.encode())
        else:  # numeric values sit in the attribute message, shortly after the name
            blob = np.asarray(value).tobytes()
            at = data.find(blob, pos + len(raw), pos + len(raw) + 256)
            if at >= 0:
                spans.append((at, at + len(blob)))
    return spans


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        elif hi > lo:
            out.append((lo, hi))
    return out


def _minus(spans: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in spans:
        pos = lo
        for tlo, thi in taken:
            if thi <= pos or tlo >= hi:
                continue
            if tlo > pos:
                out.append((pos, tlo))
            pos = max(pos, thi)
        if pos < hi:
            out.append((pos, hi))
    return out


def regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte spans ``[lo, hi)`` of each region of ``REGIONS`` in the file; they do not overlap."""
    data = path.read_bytes()
    found: dict[str, list[tuple[int, int]]] = {r: [] for r in REGIONS}
    with h5py.File(path, "r") as h5:
        found["sample"] = [(int(o), int(o) + int(n)) for o, n in h5[fmt.BYTE_RANGES][()]]
        for name in _INDEX:
            if name in h5:
                found["index"] += _dataset_spans(data, h5[name])
        for name in _STRINGS:
            for value in h5[name][()].tolist():
                found["strings"] += _heap_spans(data, value)
        found["attributes"] = _attr_spans(data, h5)
    taken: list[tuple[int, int]] = []
    for name in REGIONS[:-1]:  # earlier regions win where spans overlap
        found[name] = _minus(_merge(found[name]), taken)
        taken = _merge(taken + found[name])
    found["hdf5-metadata"] = _minus([(0, len(data))], taken)
    return found


def _pick(rng: random.Random, spans: list[tuple[int, int]]) -> int:
    sizes = np.cumsum([hi - lo for lo, hi in spans])
    k = rng.randrange(int(sizes[-1]))
    i = bisect.bisect_right(sizes.tolist(), k)
    lo = spans[i][0]
    return lo + k - (int(sizes[i - 1]) if i else 0)


# --------------------------------------------------------------------------- snapshots


def snapshot(path: Path) -> str:
    """A digest of everything h5py can read from the file (``unreadable: ...`` on an error).

    Covers every attribute of every object, and every dataset's type, shape, chunking,
    filters and contents, images included.
    """
    digest = hashlib.sha256()

    def put(*items: object) -> None:
        digest.update(repr(items).encode("utf-8", "backslashreplace"))

    try:
        with h5py.File(path, "r") as h5:

            def visit(name: str, obj: Any) -> None:
                put("obj", name, type(obj).__name__)
                for key in sorted(obj.attrs):
                    put("attr", key, obj.attrs.get_id(key).dtype.str, obj.attrs[key])
                if isinstance(obj, h5py.Dataset):
                    put(
                        "ds",
                        obj.dtype.str,
                        obj.shape,
                        obj.chunks,
                        obj.compression,
                        obj.compression_opts,
                        obj.fletcher32,
                        obj.shuffle,
                    )
                    value = obj[()]
                    if isinstance(value, np.ndarray) and value.dtype != object:
                        digest.update(np.ascontiguousarray(value).tobytes())
                    else:
                        put(np.asarray(value, dtype=object).tolist())

            visit("/", h5)
            h5.visititems(visit)
    except Exception as e:  # noqa: BLE001 - any failure to read is itself an observable change
        return f"unreadable: {type(e).__name__}: {e}"
    return digest.hexdigest()


def _read_sample(path: Path, i: int, *, verify_reads: bool) -> np.ndarray:
    ds = H5ImageDataset(path, verify_reads=verify_reads)
    try:
        return ds[i][0].numpy()
    finally:
        ds.close()


def _sample_at(path: Path, offset: int) -> int | None:
    with h5py.File(path, "r") as h5:
        ranges = h5[fmt.BYTE_RANGES][()]
    for i, (o, n) in enumerate(ranges.tolist()):
        if o <= offset < o + n:
            return i
    return None


# --------------------------------------------------------------------------- trials


def _verify_outcome(path: Path) -> tuple[str, str]:
    """``(kind, message)``: kind is ``passed``, ``detected`` or ``unclear:<ExceptionType>``."""
    try:
        verify(str(path))
    except IntegrityError as e:
        return "detected", str(e).splitlines()[-1][:160]
    except Exception as e:  # noqa: BLE001 - the campaign classifies every escape
        return f"unclear:{type(e).__name__}", f"{type(e).__name__}: {e}"[:200]
    return "passed", ""


def _flip_trial(
    res: CampaignResult,
    variant: str,
    pristine: Path,
    clean: str,
    trial: Path,
    region: str,
    offset: int,
    mask: int,
    reader_stats: dict[str, int],
) -> None:
    data = bytearray(pristine.read_bytes())
    data[offset] ^= mask
    trial.write_bytes(bytes(data))
    kind, message = _verify_outcome(trial)
    where = f"{variant} {region} byte {offset} ^= 0x{mask:02x}"
    if kind == "detected":
        res.record(f"{region}: detected", detected=True)
    elif kind.startswith("unclear"):
        res.record(
            f"{region}: {kind}",
            detected=True,
            problem=f"{where}: verify raised a raw error, not IntegrityError: {message}",
        )
    elif snapshot(trial) == clean:
        res.record(f"{region}: benign (nothing readable changed)", detected=False)
    else:
        res.record(
            f"{region}: SILENT",
            detected=False,
            lost=True,
            problem=f"{where}: verify passed but the readable content changed",
        )
    if region == "sample":
        _reader_trial(pristine, trial, offset, where, res, reader_stats)
    elif kind != "passed":
        key = f"{region} flips, reader: {_reader_scan(trial)}"
        reader_stats[key] = reader_stats.get(key, 0) + 1


def _reader_scan(path: Path) -> str:
    """What ``H5ImageDataset`` (no verify_reads) does when reading every sample of ``path``."""
    try:
        ds = H5ImageDataset(path)
        try:
            for i in range(len(ds)):
                ds[i]
        finally:
            ds.close()
    except IntegrityError:
        return "IntegrityError"
    except Exception as e:  # noqa: BLE001 - classified, reported
        return f"raw {type(e).__name__}"
    return "read every sample without error"


def _reader_trial(
    pristine: Path, trial: Path, offset: int, where: str, res: CampaignResult, stats: dict[str, int]
) -> None:
    """What ``H5ImageDataset`` does with a flipped sample, with and without verify_reads."""
    i = _sample_at(pristine, offset)
    if i is None:
        return
    good = _read_sample(pristine, i, verify_reads=False)
    try:
        got = _read_sample(trial, i, verify_reads=False)
        key = (
            "plain read: same pixels"
            if np.array_equal(got, good)
            else "plain read: wrong pixels, no error"
        )
    except IntegrityError:
        key = "plain read: IntegrityError"
    except Exception as e:  # noqa: BLE001
        key = f"plain read: raw {type(e).__name__}"
        res.problems.append(f"{where}: H5ImageDataset raised a raw {type(e).__name__}: {e}")
    stats[key] = stats.get(key, 0) + 1
    try:
        got = _read_sample(trial, i, verify_reads=True)
        if np.array_equal(got, good):
            key = "verify_reads: same pixels"
        else:
            key = "verify_reads: WRONG PIXELS"
            res.problems.append(f"{where}: verify_reads=True returned wrong pixels silently")
    except IntegrityError as e:
        key = "verify_reads: IntegrityError" + (
            " naming the sample" if f"sample {i}" in str(e) else ""
        )
    except Exception as e:  # noqa: BLE001
        key = f"verify_reads: raw {type(e).__name__}"
        res.problems.append(f"{where}: verify_reads raised a raw {type(e).__name__}: {e}")
    stats[key] = stats.get(key, 0) + 1


def _truncate_trial(
    res: CampaignResult, variant: str, pristine: Path, trial: Path, length: int
) -> None:
    trial.write_bytes(pristine.read_bytes()[:length])
    where = f"{variant} truncated to {length} bytes"
    kind, message = _verify_outcome(trial)
    ok = kind == "detected"
    problem = None if ok else f"{where}: verify gave {kind} {message}"
    outcome = _reader_scan(trial)
    if outcome == "read every sample without error":
        ok, problem = False, problem or f"{where}: H5ImageDataset read every sample silently"
    elif outcome != "IntegrityError":
        ok, problem = False, problem or f"{where}: H5ImageDataset raised {outcome}"
    res.record(
        "truncation: clear error" if ok else "truncation: UNCLEAR OR SILENT",
        detected=ok,
        lost=kind == "passed",
        problem=problem,
    )


def run(
    *,
    trials: int = 400,
    truncations: int = 100,
    seed: int = 0,
    work: Path,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """Flip ``trials`` bytes and truncate ``truncations`` times, spread over the variants.

    Regions are picked round-robin per variant so every region gets about the same number of
    trials; the byte inside a region is uniform.
    """
    t0 = time.perf_counter()
    res = CampaignResult("corruption")
    rng = random.Random(seed)
    assets = make_assets(work)
    reader_stats: dict[str, int] = {}
    per_variant = {name: (path, regions(path), snapshot(path)) for name, path in assets.items()}
    names = list(per_variant)
    for t in range(trials):
        name = names[t % len(names)]
        path, spans, clean = per_variant[name]
        region = REGIONS[(t // len(names)) % len(REGIONS)]
        if not spans[region]:
            region = "hdf5-metadata"
        offset = _pick(rng, spans[region])
        trial = work / f"trial-{name}.h5"
        _flip_trial(
            res, name, path, clean, trial, region, offset, rng.randrange(1, 256), reader_stats
        )
        if (t + 1) % 50 == 0:
            log(f"  {t + 1}/{trials} flips: {res.detected} detected, {res.lost} silent")
    for t in range(truncations):
        name = names[t % len(names)]
        path = per_variant[name][0]
        _truncate_trial(
            res, name, path, work / f"trunc-{name}.h5", rng.randrange(path.stat().st_size)
        )
    for path in work.glob("trial-*.h5"):
        path.unlink()
    for path in work.glob("trunc-*.h5"):
        path.unlink()
    res.notes.append(
        "H5ImageDataset on the flipped files: "
        + ", ".join(f"{k} {v}" for k, v in sorted(reader_stats.items()))
    )
    for name, (path, spans, _) in per_variant.items():
        sizes = {r: sum(hi - lo for lo, hi in s) for r, s in spans.items()}
        res.notes.append(
            f"{name}: {path.stat().st_size} bytes; region sizes "
            + ", ".join(f"{r} {n}" for r, n in sizes.items())
        )
    res.seconds = time.perf_counter() - t0
    shutil.rmtree(work / "source", ignore_errors=True)
    return res
