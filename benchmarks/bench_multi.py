"""Many assets as one: H5MultiDataset and MixingSampler against one asset of the same pixels.

The photo set is packed once, decoded at 224, as 8 part files (``pack_slice`` over
``plan_parts``); the **one asset** is those 8 merged byte for byte (``merge_parts``), so every
reader serves the very same pixels. All read through ``loader()`` (2 workers, batch 64,
persistent workers, one ``read_batch`` per batch), a timed round being one epoch of
``--batches`` random batches; rounds are interleaved, the order rotated each round,
the best kept. CPU per image (this process and its workers, from /proc) is reported beside
it: on a shared machine it moves much less than the rate.

* **one asset** = ``H5ImageDataset(one).loader(64, sampler=RandomSampler(...))``.
* **8 assets as one** = ``H5MultiDataset(parts).loader(64, sampler=RandomSampler(...))``: the
  same random positions in the concatenation, so a batch touches about all 8 files.
* **mixing, 2 / 4 sources** = ``H5MultiDataset(groups).loader(64,
  sampler=MixingSampler(ds, weights=...))`` over the same set packed as 2 or 4 files (all the
  pixels again; a merge would refuse halves that lack classes), weights 1:3 and 1:2:3:4, an
  epoch of the same number of draws.

    python -m benchmarks.bench_multi   # targets: 8 assets >= 0.95 x one; mixing >= 0.9 x one
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from benchmarks._common import epoch_rounds, image_root, parser, start_report, table, verdict

PARTS = 8


def _epoch(loader: DataLoader[Any]) -> int:
    """One epoch: the workers stop when it ends, so an idle loader prefetches nothing while
    another one is timed."""
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8
        n += len(labels)
    return n


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=150, help="batches per timed round")
    args = p.parse_args()
    from h5forge.discover.catalog import discover
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack_slice
    from h5forge.read.dataset import H5ImageDataset
    from h5forge.read.mixing import MixingSampler
    from h5forge.read.multi import H5MultiDataset
    from h5forge.scale.merge import merge_parts
    from h5forge.scale.plan import part_catalog, plan_parts

    report = start_report("multi: many assets as one, and mixing, vs one asset")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-multi-"))
    try:
        catalog = discover(root)

        def packed_parts(k: int, name: str) -> list[str]:
            """The photo set packed as ``k`` files of consecutive samples."""
            per = math.ceil(len(catalog.samples) / k)
            return [
                pack_slice(
                    part_catalog(catalog, spec),
                    tmp / f"{name}-{spec.index}.h5",
                    config=PackConfig(),
                    workers=None,
                ).path
                for spec in plan_parts(catalog, samples_per_part=per)
            ]

        parts = packed_parts(PARTS, "part")
        one = merge_parts(parts, tmp / "one.h5").path
        # The mixing's sources hold all the pixels too, cut in 2 and in 4 files.
        groups = {k: packed_parts(k, f"group{k}") for k in (2, 4)}
        for f in [*parts, one, *groups[2], *groups[4]]:
            with open(f, "rb") as fh:  # page cache warm for every reader
                while fh.read(16 << 20):
                    pass
        draws = args.batches * args.batch_size
        common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True}

        def shuffled(ds: Any) -> DataLoader[Any]:
            order = RandomSampler(ds, num_samples=draws, generator=torch.Generator().manual_seed(0))
            return ds.loader(args.batch_size, sampler=order, **common)

        def mixed(ds: H5MultiDataset, weights: list[float]) -> DataLoader[Any]:
            mix = MixingSampler(ds, weights=weights, length=draws, seed=0)
            return ds.loader(args.batch_size, sampler=mix, **common)

        feeds = {
            "one asset": shuffled(H5ImageDataset(one)),
            f"{len(parts)} assets as one": shuffled(H5MultiDataset(parts)),
            "mixing, 2 sources (1:3)": mixed(H5MultiDataset(groups[2]), [1, 3]),
            "mixing, 4 sources (1:2:3:4)": mixed(H5MultiDataset(groups[4]), [1, 2, 3, 4]),
        }
        for feed in feeds.values():  # start the workers, open the files
            _epoch(feed)
        rates, cost = epoch_rounds(feeds, _epoch, args.repeat)
        best = {name: max(r) for name, r in rates.items()}
        report.add(
            f"Input: {what}, decoded at 224 into {len(parts)} part files, and their "
            "byte-copy merge as the one asset; the mixing's sources are the same set packed "
            f"as 2 and as 4 files. DataLoader: {args.workers} "
            f"workers, batch {args.batch_size}, epochs of {args.batches} random batches, "
            "persistent workers; page cache warm."
        )
        base = best["one asset"]
        report.add(
            table(
                [
                    "reader",
                    "images/s (best)",
                    "all rounds",
                    "/ one asset",
                    "CPU ms / image (median; workers + main)",
                    "one asset's CPU / this",
                ],
                [
                    [
                        name,
                        f"{best[name]:,.0f}",
                        ", ".join(f"{x:,.0f}" for x in rates[name]),
                        f"{best[name] / base:.2f}x",
                        f"{cost[name] * 1e3:.3f}",
                        f"{cost['one asset'] / cost[name]:.2f}x",
                    ]
                    for name in feeds
                ],
            )
        )
        lines = []
        for name in list(feeds)[1:]:
            target = 0.95 if name.endswith("as one") else 0.9
            ratio = best[name] / base
            lines.append(
                f"- {name} / one asset = **{ratio:.2f}x**, {verdict(ratio, target)}; by CPU per "
                f"image {cost['one asset'] / cost[name]:.2f}x"
            )
        report.add("\n".join(lines))
        del feeds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
