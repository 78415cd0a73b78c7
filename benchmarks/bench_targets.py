"""Reading targets beside the images (#15): classification unchanged, masks, boxes.

The photo set is packed twice, decoded at 224 (the default policy): **v1**, class only (format
version 1, today's file), and **v2**, the same images with two target columns: a mask per
image (a 224 x 224 uint8 class-id image, a third of the pixel bytes) and 1-8 boxes per image,
drawn from the photo's index, moved by the pack's resize and crop like the image. All read
through ``loader()`` (2 workers, batch 64, persistent workers, one ``read_batch`` per batch:
the target columns' ranges read in the same call as the images), a timed round being one epoch
of ``--batches`` random batches; rounds interleaved, the order rotated each round, the
best kept; beside each ratio of bests, the median of the rounds' ratios (the two readers of
a ratio in the same round) and the ratio of CPU per image (this process and its workers).

* **v1, class** = ``H5ImageDataset(v1).loader(...)``: today's path.
* **v2, class** = ``H5ImageDataset(v2)`` (``target="class"``): a v2 file read for its classes.
* **v2, mask** = ``target="mask"``: ``(images, masks B x H x W)``.
* **v2, boxes** = ``target="boxes"``: ``(images, [B boxes dicts])``, each ``boxes`` and
  ``labels`` (the default).
* **v2, boxes + iscrowd** = the same with ``iscrowd=True`` (COCO evaluation's dict): reported,
  no target.

    python -m benchmarks.bench_targets  # targets: v2 class >= 0.97 x v1 class;
                                        # mask >= 0.45 x class; boxes >= 1/1.1 x class
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader, RandomSampler

from benchmarks._common import epoch_rounds, image_root, parser, start_report, table, verdict


def _epoch(loader: DataLoader[Any]) -> int:
    """One epoch: the workers stop when it ends, so an idle loader prefetches nothing while
    another one is timed."""
    n = 0
    for images, _ in loader:
        n += len(images)
    return n


def _with_targets(catalog: Any, folder: Path) -> Any:
    """``catalog`` with a mask column and a boxes column (synthetic, seeded by the index)."""
    from dataclasses import replace

    from h5forge.targets.schema import Column

    folder.mkdir()
    samples = []
    for i, s in enumerate(catalog.samples):
        with Image.open(s.path) as im:
            w, h = im.size
        rng = np.random.default_rng(i)
        mask = np.zeros((h, w), np.uint8)
        boxes = []
        for _ in range(1 + i % 8):
            x1, y1 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            x2, y2 = x1 + int(rng.integers(8, w // 2)), y1 + int(rng.integers(8, h // 2))
            mask[y1:y2, x1:x2] = 1 + len(boxes) % 3
            boxes.append((float(x1), float(y1), float(x2), float(y2), len(boxes) % 2, 0))
        path = folder / f"{i:06d}.png"
        Image.fromarray(mask).save(path, compress_level=1)
        samples.append(replace(s, targets=(str(path), tuple(boxes))))
    schema = (Column("seg", "mask"), Column("objects", "boxes", classes=("a", "b")))
    return replace(catalog, samples=tuple(samples), schema=schema)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=1000, help="batches per timed round")
    args = p.parse_args()
    from h5forge.discover.catalog import discover
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.read.dataset import H5ImageDataset

    report = start_report("targets: class, mask and boxes read beside the images")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-targets-"))
    try:
        catalog = discover(root)
        v1 = pack(catalog, tmp / "v1.h5", config=PackConfig()).path
        v2 = pack(_with_targets(catalog, tmp / "masks"), tmp / "v2.h5", config=PackConfig()).path
        for f in (v1, v2):
            with open(f, "rb") as fh:  # page cache warm for every reader
                while fh.read(16 << 20):
                    pass
        draws = args.batches * args.batch_size
        common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True}

        def shuffled(ds: H5ImageDataset) -> DataLoader[Any]:
            order = RandomSampler(ds, num_samples=draws)
            return ds.loader(args.batch_size, sampler=order, **common)

        feeds = {
            "v1, class": shuffled(H5ImageDataset(v1)),
            "v2, class": shuffled(H5ImageDataset(v2)),
            "v2, boxes": shuffled(H5ImageDataset(v2, target="boxes")),
            "v2, mask": shuffled(H5ImageDataset(v2, target="mask")),
            "v2, boxes + iscrowd": shuffled(H5ImageDataset(v2, target="boxes", iscrowd=True)),
        }
        for feed in feeds.values():  # start the workers, open the files
            _epoch(feed)
        rates, cost = epoch_rounds(feeds, _epoch, args.repeat)
        best = {name: max(r) for name, r in rates.items()}
        sizes = {name: Path(f).stat().st_size for name, f in (("v1", v1), ("v2", v2))}
        report.add(
            f"Input: {what}, decoded at 224 (v1 {sizes['v1'] / 2**20:,.0f} MiB, v2 with masks "
            f"and boxes {sizes['v2'] / 2**20:,.0f} MiB). DataLoader: {args.workers} workers, "
            f"batch {args.batch_size}, epochs of {args.batches} random batches, persistent "
            "workers; page cache warm."
        )
        base = best["v1, class"]
        report.add(
            table(
                ["reader", "images/s (best)", "all rounds", "/ v1 class", "CPU ms / image"],
                [
                    [
                        name,
                        f"{best[name]:,.0f}",
                        ", ".join(f"{x:,.0f}" for x in rates[name]),
                        f"{best[name] / base:.2f}x",
                        f"{cost[name] * 1e3:.3f}",
                    ]
                    for name in feeds
                ],
            )
        )
        checks = [
            ("v2, class", "v1, class", 0.97, ""),
            ("v2, mask", "v2, class", 0.45, " (image only)"),
            ("v2, boxes", "v2, class", 1 / 1.1, " (boxes add <= 10%)"),
            ("v2, boxes + iscrowd", "v2, class", None, ""),
        ]
        lines = []
        for ours, than, target, why in checks:
            ratio = best[ours] / best[than]
            # both in the same round (class and boxes back to back): the load of the moment
            pairs = statistics.median(a / b for a, b in zip(rates[ours], rates[than], strict=True))
            said = "reported, no target" if target is None else verdict(ratio, target)
            lines.append(
                f"- {ours} / {than}{why} = **{ratio:.2f}x**, {said}; median "
                f"of the rounds' ratios {pairs:.2f}x; by CPU per image "
                f"{cost[than] / cost[ours]:.2f}x"
            )
        report.add("\n".join(lines))
        del feeds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
