"""Read speed through a DataLoader (2 workers, batch 64, shuffled): h5forge vs baselines.

* **h5forge decoded** = ``H5ImageDataset.loader()`` over a decoded 224x224 file: one
  ``read_batch`` per batch (automatic batching off), the batch read with one ``pread`` per
  sample straight into a shared-memory N x C x H x W (channels-last) tensor: no collate copy.
* **numpy memmap, batch reads** = the same pixels in an ``(N, 224, 224, 3)`` ``.npy`` file,
  memory-mapped, a batch gathered with one sorted ``np.take`` straight into a shared-memory
  tensor, in the same DataLoader mode: the fastest plain-numpy reader.
* **h5forge decoded, Sampler** = ``ds.loader(64, shuffle=True)``: the default order,
  :class:`h5forge.Sampler` (resumable, DDP-aware), against **h5forge decoded, RandomSampler**,
  the same loader over torch's ``RandomSampler`` (the default before it); both whole epochs,
  four times as many images a round as the others (short rounds at 40-50k images/s are noise).
* **default collate** rows: both read the standard way, ``DataLoader(ds, batch_size=64)``
  (``__getitems__`` per batch, then ``default_collate`` stacks the samples into NCHW: a
  transposing copy of every pixel). torch's stack writes into new shared memory each batch,
  whose first touch of every page is a zero-filling fault; h5forge's images are stacked by
  ``default_collate`` into a worker's reused slot instead (:mod:`h5forge.read.stacked`, through
  ``default_collate_fn_map``, torch's documented extension point). **h5forge decoded, default
  collate, torch's stack** is the same read handing out plain tensors, which torch stacks as
  the memmap's: what the read itself costs in that mode.
* **JPEG folder** = the usual recipe: decode + resize + crop each JPEG with Pillow in
  ``__getitem__`` (torchvision's ``ImageFolder`` + ``Resize(224)`` + ``CenterCrop(224)`` on PIL
  images), uint8 tensors out.
* **h5forge encoded** = ``H5ImageDataset`` over the original JPEG bytes (decoded at read time)
  with a resize + crop transform, so it yields the same 224x224 batches. It yields tensors, so
  its natural transform works on tensors: torch's antialiased bilinear on uint8 (what
  torchvision's v2 ``Resize`` does on tensors; the same pixels as Pillow's +-1). Because that is
  faster than Pillow's resize, the folder recipe is also measured with the very same tensor
  transform (**JPEG folder, tensor transform**): that pair differs only in where the JPEG bytes
  come from. h5forge encoded is also measured with a Pillow round trip (tensor -> PIL ->
  Pillow's resize), the same resize code as the classic folder recipe.

All loaders run with persistent workers; after a warm-up epoch they are timed round-robin for
``--repeat`` rounds (best kept; the order reverses every other round). A round is one epoch of a
fixed number of random batches, so a loader's workers are idle (nothing prefetched in the
background) while another is timed.

    python -m benchmarks.bench_read    # targets: decoded >= 0.95 x memmap, >= 25 x folder;
                                       # encoded >= 1.0 x folder, file <= 1.01 x source bytes;
                                       # Sampler >= 0.95 x RandomSampler; collate >= 1.0 x
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from benchmarks._common import image_root, parser, start_report, table, verdict
from benchmarks._datasets import (
    JpegFolder,
    JpegFolderTensor,
    Memmap,
    MemmapBatches,
    PlainImages,
    ResizeCrop,
    TensorResizeCrop,
)
from h5forge.read.dataset import H5ImageDataset


def _epoch(loader: DataLoader[Any]) -> int:
    """One epoch (a fixed number of random batches): the workers stop when it ends, so an idle
    loader prefetches nothing in the background while another one is timed."""
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8
        n += len(labels)
    return n


def _cpu(loader: DataLoader[Any]) -> float:
    """CPU seconds so far of this process and of the loader's (persistent) worker processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for worker in loader._iterator._workers:  # type: ignore[union-attr]
        with open(f"/proc/{worker.pid}/stat") as f:
            total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13]) / tick
    return total


def _loader(ds: Any, batches: int, args: Any) -> DataLoader[Any]:
    """A shuffled DataLoader of ``batches`` batches over ``ds`` in the reader's own mode."""
    sampler = RandomSampler(
        ds.dataset if isinstance(ds, _Collated) else ds,
        num_samples=batches * args.batch_size,
        generator=torch.Generator().manual_seed(0),
    )
    common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True}
    if isinstance(ds, H5ImageDataset):  # its fast path: one read_batch per batch
        return ds.loader(args.batch_size, sampler=sampler, **common)
    if isinstance(ds, MemmapBatches):  # the same DataLoader mode: automatic batching off
        return DataLoader(
            ds,
            batch_size=None,
            **common,
            sampler=BatchSampler(sampler, args.batch_size, drop_last=False),
        )
    if isinstance(ds, _Collated):
        ds = ds.dataset
    return DataLoader(ds, batch_size=args.batch_size, sampler=sampler, **common)


class _Repeat:
    """A whole-epoch loader run ``times`` epochs per timed round."""

    def __init__(self, loader: DataLoader[Any], times: int) -> None:
        self.loader, self.times = loader, times

    def __iter__(self) -> Any:
        for _ in range(self.times):
            yield from self.loader

    @property
    def _iterator(self) -> Any:
        return self.loader._iterator


class _Collated:
    """Marks a dataset to be read the standard way: ``DataLoader(ds, batch_size=64)``
    (``__getitems__`` per batch, then torch's ``default_collate`` stacks the samples)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset


def _to_npy(h5_path: Path, npy: Path) -> np.ndarray:
    import h5py

    with h5py.File(h5_path) as h5:
        images = h5["images"]
        out = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=images.shape)
        for lo in range(0, images.shape[0], 256):  # never the whole set in memory
            out[lo : lo + 256] = images[lo : lo + 256]
        out.flush()
        del out
        return h5["labels"][()]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--batches", type=int, default=150, help="batches per timed round of the fast loaders"
    )
    p.add_argument(
        "--slow-batches",
        type=int,
        default=48,
        help="batches per timed round of the decoding loaders",
    )
    args = p.parse_args()
    from h5forge import H5ImageDataset
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig

    report = start_report("read: DataLoader, h5forge vs numpy memmap and a JPEG folder")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-read-"))
    try:
        decoded = pack(root, tmp / "decoded.h5")
        encoded = pack(
            root,
            tmp / "encoded.h5",
            config=PackConfig(ImageConfig(layout="encoded", resize="none", size=None)),
        )
        labels = _to_npy(tmp / "decoded.h5", tmp / "pixels.npy")
        # Further layouts, for the guidance in benchmarks/README.md (no targets).
        extra = {
            "h5forge decoded + gzip-4": pack(
                root, tmp / "gzip.h5", config=PackConfig(compression="gzip")
            ),
            "h5forge decoded + lzf": pack(
                root, tmp / "lzf.h5", config=PackConfig(compression="lzf")
            ),
            "h5forge encoded jpeg q90 224": pack(
                root,
                tmp / "jpeg224.h5",
                config=PackConfig(ImageConfig(layout="encoded", encoding="jpeg")),
            ),
        }
        from h5forge.discover.catalog import discover

        catalog = discover(root)
        files = [Path(s.path) for s in catalog.samples]
        src_bytes = sum(f.stat().st_size for f in files)
        for f in [*files, tmp / "decoded.h5", tmp / "encoded.h5", tmp / "pixels.npy"]:
            with open(f, "rb") as fh:  # page cache warm for every reader
                while fh.read(16 << 20):
                    pass
        folder_labels = [s.label for s in catalog.samples]
        datasets: dict[str, Any] = {
            "h5forge decoded": H5ImageDataset(decoded.path),
            "numpy memmap, batch reads": MemmapBatches(tmp / "pixels.npy", labels),
            "h5forge decoded, default collate": _Collated(H5ImageDataset(decoded.path)),
            "numpy memmap, default collate": _Collated(Memmap(tmp / "pixels.npy", labels)),
            "h5forge decoded, default collate, torch's stack": _Collated(
                PlainImages(H5ImageDataset(decoded.path))
            ),
            "JPEG folder": JpegFolder(files, folder_labels),
            "JPEG folder, tensor transform": JpegFolderTensor(files, folder_labels),
            "h5forge encoded, tensor transform": H5ImageDataset(
                encoded.path, transform=TensorResizeCrop()
            ),
            "h5forge encoded, Pillow round trip": H5ImageDataset(
                encoded.path, transform=ResizeCrop()
            ),
            **{name: H5ImageDataset(r.path) for name, r in extra.items()},
        }
        ds = datasets["h5forge decoded"]
        # Whole epochs, four times the others' images a round: at 40-50k images/s a round of
        # the others' length lasts well under a second, and one stall decides a best-of.
        times = 4 * -(-args.batches * args.batch_size // len(ds))
        common: dict[str, Any] = {"num_workers": args.workers, "persistent_workers": True}
        whole = {
            "h5forge decoded, Sampler": ds.loader(args.batch_size, shuffle=True, **common),
            "h5forge decoded, RandomSampler": ds.loader(
                args.batch_size, sampler=RandomSampler(ds), **common
            ),
        }
        slow = {
            name for name in datasets if not name.startswith(("h5forge decoded", "numpy memmap"))
        }
        feeds: dict[str, Any] = {
            name: _loader(ds, args.slow_batches if name in slow else args.batches, args)
            for name, ds in datasets.items()
        }
        feeds |= {name: _Repeat(loader, times) for name, loader in whole.items()}
        for feed in feeds.values():  # start the workers, open the files
            _epoch(feed)
        rates: dict[str, list[float]] = {name: [] for name in feeds}
        cpu: dict[str, list[float]] = {name: [] for name in feeds}
        for r in range(args.repeat):
            names = list(feeds) if r % 2 == 0 else list(feeds)[::-1]  # no loader always first
            for name in names:
                feed = feeds[name]
                c0, t0 = _cpu(feed), time.perf_counter()
                n = _epoch(feed)
                rates[name].append(n / (time.perf_counter() - t0))
                cpu[name].append((_cpu(feed) - c0) / n)
                print(
                    f"  {name}: {rates[name][-1]:,.0f} img/s, {cpu[name][-1] * 1e3:.2f} CPU ms/img",
                    flush=True,
                )
        best = {name: max(r) for name, r in rates.items()}
        cost = {name: statistics.median(c) for name, c in cpu.items()}
        size_ratio = Path(encoded.path).stat().st_size / src_bytes
        report.add(
            f"Input: {what}. DataLoader: {args.workers} workers, batch "
            f"{args.batch_size}, shuffled (random batches; each timed round is one "
            f"epoch of {args.batches} batches, {args.slow_batches} for the decoding "
            "readers), persistent workers; page "
            "cache warm."
        )
        sizes = {
            "h5forge decoded": decoded.bytes,
            "numpy memmap, batch reads": decoded.bytes,
            "h5forge decoded, default collate": decoded.bytes,
            "numpy memmap, default collate": decoded.bytes,
            "h5forge decoded, default collate, torch's stack": decoded.bytes,
            "h5forge decoded, Sampler": decoded.bytes,
            "h5forge decoded, RandomSampler": decoded.bytes,
            "h5forge encoded, tensor transform": encoded.bytes,
            "h5forge encoded, Pillow round trip": encoded.bytes,
            **{name: r.bytes for name, r in extra.items()},
        }
        report.add(
            table(
                [
                    "reader",
                    "images/s (best)",
                    "all rounds",
                    "CPU ms / image (median; workers + main)",
                    "file / source bytes",
                ],
                [
                    [
                        name,
                        f"{best[name]:,.0f}",
                        ", ".join(f"{r:,.0f}" for r in rates[name]),
                        f"{cost[name] * 1e3:.3f}",
                        f"{sizes[name] / src_bytes:.3f}" if name in sizes else "1 (the JPEGs)",
                    ]
                    for name in feeds
                ],
            )
        )
        report.add(
            "CPU per image is what the machine spends on each image, whatever else runs "
            "on it; the ratio of two readers' CPU per image is what their throughput "
            "ratio tends to on an otherwise idle machine where both are CPU-bound."
        )
        d_mm = best["h5forge decoded"] / best["numpy memmap, batch reads"]
        s_rs = best["h5forge decoded, Sampler"] / best["h5forge decoded, RandomSampler"]
        s_pairs = statistics.median(
            a / b
            for a, b in zip(
                rates["h5forge decoded, Sampler"],
                rates["h5forge decoded, RandomSampler"],
                strict=True,
            )
        )
        c_mm = best["h5forge decoded, default collate"] / best["numpy memmap, default collate"]
        c_jpg = best["h5forge decoded, default collate"] / best["JPEG folder"]
        plain_stack = "h5forge decoded, default collate, torch's stack"
        c_plain = best[plain_stack] / best["numpy memmap, default collate"]
        d_jpg = best["h5forge decoded"] / best["JPEG folder"]
        e_same = best["h5forge encoded, tensor transform"] / best["JPEG folder, tensor transform"]
        e_jpg = best["h5forge encoded, tensor transform"] / best["JPEG folder"]
        e_pil = best["h5forge encoded, Pillow round trip"] / best["JPEG folder"]

        def by_cpu(ours: str, base: str) -> str:
            return f"by CPU per image {cost[base] / cost[ours]:.2f}x"

        report.add(
            "\n".join(
                [
                    f"- decoded (`ds.loader()`) / memmap (batch reads, the same DataLoader mode) = "
                    f"**{d_mm:.2f}x**, {verdict(d_mm, 0.95)}; "
                    + by_cpu("h5forge decoded", "numpy memmap, batch reads"),
                    f"- decoded (`ds.loader()`) / JPEG folder = **{d_jpg:.1f}x**, "
                    f"{verdict(d_jpg, 25)}; " + by_cpu("h5forge decoded", "JPEG folder"),
                    f"- standard `DataLoader(ds, batch_size={args.batch_size})` (default collate): "
                    f"decoded / memmap = **{c_mm:.2f}x**, {verdict(c_mm, 1.0)}; "
                    + by_cpu("h5forge decoded, default collate", "numpy memmap, default collate")
                    + f"; decoded / JPEG folder = **{c_jpg:.1f}x**; with torch's own stack "
                    f"(plain tensors, new shared memory a batch): **{c_plain:.2f}x** memmap, "
                    + by_cpu(plain_stack, "numpy memmap, default collate"),
                    f"- `ds.loader(shuffle=True)` with the Sampler / with RandomSampler = "
                    f"**{s_rs:.2f}x**, {verdict(s_rs, 0.95)}; median of the rounds' ratios "
                    f"(the two run back to back in each round) {s_pairs:.2f}x; "
                    + by_cpu("h5forge decoded, Sampler", "h5forge decoded, RandomSampler"),
                    f"- encoded / JPEG folder, same tensor transform on both = **{e_same:.2f}x**, "
                    f"{verdict(e_same, 1.0)}; "
                    + by_cpu("h5forge encoded, tensor transform", "JPEG folder, tensor transform"),
                    "- encoded (tensor transform) / JPEG folder (Pillow recipe) = "
                    f"**{e_jpg:.2f}x**, "
                    f"{verdict(e_jpg, 1.0)}; "
                    + by_cpu("h5forge encoded, tensor transform", "JPEG folder")
                    + f"; with a Pillow round trip instead: {e_pil:.2f}x",
                    f"- encoded file / source bytes = **{size_ratio:.4f}**, "
                    f"{verdict(size_ratio, 1.01, at_most=True)} "
                    f"({Path(encoded.path).stat().st_size:,}"
                    f" / {src_bytes:,} bytes)",
                ]
            )
        )
        del feeds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
