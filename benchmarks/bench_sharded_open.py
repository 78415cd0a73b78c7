"""Reading a sharded version: its open, and ``loader()`` against the same samples in one file.

Two measurements, medians of ``--repeat`` interleaved rounds, page cache warm:

- **open**: ``H5ImageDataset(BASE)`` (the pointer, the manifest read and checked, the global
  index) of a version of ``--shards`` shards of ``--per-shard`` samples (1,000 x 1,000 = 1M by
  default), each with a deletion vector and train/val counts, whose shard files are never
  opened (none is written: opening reads the manifest alone, which is what is measured); also
  with ``split="train"``. Shown against ``H5ImageDataset(FILE)`` of the photo set packed as one
  file. Target (issue 29): <= 1 s.
- **loader**: images/s of one ``loader(64, shuffle=True, num_workers=2)`` epoch over the photo
  set packed (decoded 224) as one file and as a sharded version of shards of about
  ``--shard-mib`` MiB of the same samples (``pack_slice(shard=True)``, the manifest written as
  the publisher writes it). Target (issue 29): sharded >= 0.95x of one file.

    python -m benchmarks.bench_sharded_open --count 2000 --repeat 5
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import (
    epoch_rounds,
    image_root,
    interleave,
    parser,
    start_report,
    table,
    verdict,
)
from h5forge.asset import format as fmt
from h5forge.asset.index import load_index
from h5forge.asset.open import open_h5
from h5forge.discover.catalog import Catalog, discover
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack_slice
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.manifest import (
    ShardEntry,
    VersionManifest,
    manifest_bytes,
    manifest_key,
    shard_key,
)
from h5forge.publish.versions import write_pointer
from h5forge.read.dataset import H5ImageDataset


def _publish(base: Path, classes: tuple[str, ...], entries: list[ShardEntry]) -> str:
    """The manifest of ``entries`` at ``base`` and the pointer to it; its sha256."""
    manifest = VersionManifest(name=base.name, classes=classes, shards=tuple(entries))
    data = manifest_bytes(manifest)
    sha = hashlib.sha256(data).hexdigest()
    where = base / manifest_key(base.name, sha)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(data)
    write_pointer(Location(str(base)), sha, kind="sharded")
    return sha


def synthetic_version(base: Path, shards: int, per_shard: int) -> int:
    """A manifest of ``shards`` entries (no shard file written); its manifest's bytes."""
    rng = np.random.default_rng(0)
    classes = tuple(f"class{c:04d}" for c in range(1000))
    entries = []
    for k in range(shards):
        deleted = tuple(sorted(rng.choice(per_shard, 10, replace=False).tolist()))
        live = per_shard - len(deleted)
        entries.append(
            ShardEntry(
                sha256=hashlib.sha256(f"shard {k}".encode()).hexdigest(),
                bytes=per_shard * 150_000,
                metadata_sha256=hashlib.sha256(f"meta {k}".encode()).hexdigest(),
                samples=per_shard,
                deleted=deleted,
                labels=tuple(range(k % 900, k % 900 + 100)),
                splits={"train": live - live // 10, "val": live // 10},
            )
        )
    sha = _publish(base, classes, entries)
    return (base / manifest_key(base.name, sha)).stat().st_size


def sharded_copy(catalog: Catalog, base: Path, shards: int, config: PackConfig) -> None:
    """The catalog packed as ``shards`` shards under ``base``, and its manifest."""
    (base / "shards").mkdir(parents=True)
    n = len(catalog.samples)
    entries = []
    for k in range(shards):
        part = catalog.samples[k * n // shards : (k + 1) * n // shards]
        out = base / f"{k}.h5"
        pack_slice(
            dataclasses.replace(catalog, samples=part),
            out,
            config=config,
            workers=2,
            shard=True,
        )
        data = out.read_bytes()
        with open_h5(Location(str(out))) as h5:
            idx = load_index(h5, where=str(out))
            meta = str(h5.attrs[fmt.A_METADATA_SHA256])
        entry = ShardEntry(
            sha256=hashlib.sha256(data).hexdigest(),
            bytes=len(data),
            metadata_sha256=meta,
            samples=idx.header.num_samples,
            labels=tuple(range(len(catalog.classes))),
            splits={
                name: int(np.count_nonzero(idx.split_codes == c))
                for c, name in enumerate(idx.split_names)
                if name
            },
        )
        shutil.move(out, base / shard_key(entry.sha256))
        entries.append(entry)
    _publish(base, catalog.classes, entries)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=1000, help="shards of the synthetic version")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per synthetic shard")
    p.add_argument(
        "--shard-mib",
        type=int,
        default=64,
        help="size of the photo set's shards (MiB; the issue's example size)",
    )
    args = p.parse_args()
    report = start_report("Sharded versions: open and read (issue 29)")
    root, described = image_root(args)
    config = PackConfig(ImageConfig())
    with tempfile.TemporaryDirectory(prefix="h5bench-shopen-") as tmp:
        work = Path(tmp)
        big = work / "synthetic" / "big"
        manifest_size = synthetic_version(big, args.shards, args.per_shard)
        catalog = discover(root)
        one = work / "one.h5"
        pack_slice(catalog, one, config=config, workers=2)
        sharded = work / "store" / "photos"
        loader_shards = max(1, -(-one.stat().st_size // (args.shard_mib << 20)))
        sharded_copy(catalog, sharded, loader_shards, config)
        n_big = len(H5ImageDataset(big))
        one_size = one.stat().st_size

        def open_big() -> None:
            assert len(H5ImageDataset(big)) == n_big

        def open_split() -> None:
            len(H5ImageDataset(big, split="train"))

        def open_one() -> None:
            len(H5ImageDataset(one))

        opens = interleave(
            {"sharded": open_big, "sharded, split": open_split, "one file": open_one}, args.repeat
        )
        datasets = {"one file": H5ImageDataset(one), "sharded": H5ImageDataset(sharded)}
        assert len(datasets["one file"]) == len(datasets["sharded"])
        feeds = {
            f"{name}{', persistent' if keep else ''}": ds.loader(
                64, shuffle=True, num_workers=2, persistent_workers=keep
            )
            for keep in (False, True)
            for name, ds in datasets.items()
        }

        def epoch(loader: Any) -> int:
            n = 0
            for images, _ in loader:
                n += len(images)
            return n

        rates: dict[str, list[float]] = {k: [] for k in feeds}
        for _ in range(args.repeat):  # epoch_rounds rotates the order; one round per call
            got, _cpu = epoch_rounds(feeds, epoch, 1)
            for k in feeds:
                rates[k].extend(got[k])
        del feeds  # persistent workers end here
    med = {k: statistics.median(v) for k, v in opens.items()}
    report.add(
        f"Open: a version of {args.shards:,} shards x {args.per_shard:,} samples "
        f"({n_big:,} live samples; 10 deleted rows, train/val counts and a 100-class label map "
        f"per shard; manifest {manifest_size:,} bytes), no shard opened; against one file of "
        f"{len(datasets['one file']):,} samples. Medians of {args.repeat} interleaved rounds."
    )
    report.add(
        table(
            ["open", "median ms", "target"],
            [
                [
                    "sharded version (H5ImageDataset(BASE))",
                    f"{med['sharded'] * 1e3:.1f}",
                    verdict(med["sharded"], 1.0, at_most=True),
                ],
                [
                    "sharded version, split='train'",
                    f"{med['sharded, split'] * 1e3:.1f}",
                    verdict(med["sharded, split"], 1.0, at_most=True),
                ],
                ["one file (H5ImageDataset(FILE))", f"{med['one file'] * 1e3:.1f}", ""],
            ],
        )
    )
    r = {k: statistics.median(v) for k, v in rates.items()}
    report.add(
        f"Loader: {described}; decoded 224, one file ({one_size:,} bytes) vs "
        f"{loader_shards} shards of about {args.shard_mib} MiB of the same samples; "
        f"loader(64, shuffle=True, num_workers=2), with and without persistent_workers "
        f"(without: every epoch's workers are new processes; loader() checks each local "
        f"shard once, before the first epoch's workers fork, and they reopen it by its file "
        f"identity), one epoch per round, medians of "
        f"{args.repeat} rounds (order rotated each round)."
    )
    report.add(
        table(
            ["feed", "median img/s", "ratio", "target"],
            [
                row
                for keep in ("", ", persistent")
                for row in (
                    [f"one file{keep}", f"{r['one file' + keep]:,.0f}", "1.00x", ""],
                    [
                        f"sharded version{keep}",
                        f"{r['sharded' + keep]:,.0f}",
                        f"{r['sharded' + keep] / r['one file' + keep]:.2f}x",
                        verdict(r["sharded" + keep] / r["one file" + keep], 0.95),
                    ],
                )
            ],
        )
    )
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
