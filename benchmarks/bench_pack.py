"""Pack speed: h5forge vs the decode+resize rate of the machine, and vs the naive recipe.

* **ideal** = workers x the one-core rate of a plain Pillow decode + resize (torchvision's
  ``Resize(224)`` + ``CenterCrop(224)`` on PIL images) of the same files, in this process. A
  pack cannot beat it: it is the decode alone, without reading, hashing, writing or verifying.
* **h5forge** = ``h5forge.pack`` decoded 224x224 with ``workers`` processes, timed end to end:
  discovery, decoding, writing, full verification, sealing and fsync.
* **parallel ideal** = the same plain decode + resize run by ``workers`` processes at once (a
  pre-started pool, only lengths sent back): what ``workers`` decoders really get from the
  machine at that moment. On an idle machine it equals the ideal; on a shared one it shows
  how much of the gap is other people's load rather than h5forge.
* **CPU per image**: CPU seconds of the whole process tree (writer and workers) per image, vs
  the plain decode's CPU per image: h5forge's overhead, independent of the machine's load.
* **naive** = the well-known recipe: one gzip-9 dataset per image, pixels through
  ``torch.Tensor(list(img.getdata()))``, in one process; run on a subset, rate extrapolated.

The ideal and h5forge runs are interleaved, best of ``--repeat``. Further variants (encoded,
compressed) are packed once each, for the layout guidance in benchmarks/README.md.

    python -m benchmarks.bench_pack               # targets: >= 0.85 x ideal, >= 20 x naive
    python -m benchmarks.bench_pack --images ~/imagenet-val-1k
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks._common import (
    best,
    image_root,
    interleave,
    parser,
    start_report,
    table,
    timed,
    tree_cpu,
    verdict,
)
from benchmarks.photoset import image_files

SIDE = 224


def decode_resize(path: str | Path) -> bytes:
    """The plain recipe: decode, RGB, shorter side to 224 (bilinear), centre crop 224."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        nw, nh = (SIDE, int(SIDE * h / w)) if w <= h else (int(SIDE * w / h), SIDE)
        im = im.resize((nw, nh), Image.Resampling.BILINEAR)
        left, top = int(round((nw - SIDE) / 2.0)), int(round((nh - SIDE) / 2.0))
        return np.asarray(im.crop((left, top, left + SIDE, top + SIDE))).tobytes()


def _decode_count(paths: list[str]) -> int:
    return sum(len(decode_resize(p)) for p in paths)


def naive_pack(files: list[Path], out: Path) -> None:
    """One gzip-9 dataset per image, decoded through a Python list (the seed recipe)."""
    import h5py
    import torch

    with h5py.File(out, "w") as h5:
        for i, p in enumerate(files):
            img = Image.open(p).convert("RGB").resize((SIDE, SIDE))
            pixels = torch.Tensor(list(img.get_flattened_data())).view(SIDE, SIDE, 3)
            h5.create_dataset(
                f"images/{i:06d}", data=pixels.numpy(), compression="gzip", compression_opts=9
            )
            h5.create_dataset(f"labels/{i:06d}", data=i % 10)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="pack worker processes (default: usable CPUs)",
    )
    p.add_argument(
        "--naive-count",
        type=int,
        default=60,
        help="images the naive recipe packs (its rate is extrapolated)",
    )
    p.add_argument(
        "--no-variants", action="store_true", help="skip the one-off encoded and compressed packs"
    )
    args = p.parse_args()
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig

    report = start_report("pack: h5forge vs workers x one-core decode+resize, and vs naive")
    root, what = image_root(args)
    files = image_files(root)
    src_bytes = sum(f.stat().st_size for f in files)
    subset = files[:: max(1, len(files) // 500)]  # spread over the set, >= 500 files
    for f in files:  # page cache warm for every run
        f.read_bytes()
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-pack-"))
    out = tmp / "decoded.h5"
    first, _ = timed(lambda: pack(root, out, workers=args.workers, overwrite=True))
    cpu: dict[str, list[float]] = {"decode": [], "pack": []}

    def one_core_run() -> None:
        t0 = time.process_time()
        for f in subset:
            decode_resize(f)
        cpu["decode"].append((time.process_time() - t0) / len(subset))

    def pack_run() -> None:
        c0 = tree_cpu()
        pack(root, out, workers=args.workers, overwrite=True)
        cpu["pack"].append((tree_cpu() - c0) / len(files))

    shares = [[str(f) for f in files[i :: args.workers * 8]] for i in range(args.workers * 8)]
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(args.workers) as decoders:
        decoders.map(_decode_count, [[str(files[0])]] * args.workers)  # started, warm
        times = interleave(
            {
                "one-core decode+resize": one_core_run,
                "parallel decode+resize": lambda: decoders.map(_decode_count, shares, chunksize=1),
                "h5forge pack": pack_run,
            },
            args.repeat,
        )
    one_core = len(subset) / best(times["one-core decode+resize"])
    ideal = args.workers * one_core
    parallel = len(files) / best(times["parallel decode+resize"])
    rate = len(files) / best(times["h5forge pack"])
    cpu_decode, cpu_pack = min(cpu["decode"]), min(cpu["pack"])
    naive_files = files[:: max(1, len(files) // args.naive_count)][: args.naive_count]
    naive_s, _ = timed(lambda: naive_pack(naive_files, tmp / "naive.h5"))
    naive_rate = len(naive_files) / naive_s
    naive_ratio = (tmp / "naive.h5").stat().st_size / sum(f.stat().st_size for f in naive_files)
    size = out.stat().st_size

    report.add(f"Input: {what}. Workers: {args.workers}. Page cache warm.")
    rows = [
        ["one-core decode+resize (Pillow, in process)", f"{one_core:,.0f}", "", ""],
        [f"ideal = {args.workers} x one core", f"{ideal:,.0f}", "1.00", ""],
        [
            f"parallel ideal: {args.workers} processes decoding at once",
            f"{parallel:,.0f}",
            f"{parallel / ideal:.2f}",
            "",
        ],
        [
            "h5forge pack, decoded 224, best",
            f"{rate:,.0f}",
            f"{rate / ideal:.2f}",
            f"{size / src_bytes:.2f}",
        ],
        [
            "h5forge pack, first run in the process (pool start-up)",
            f"{len(files) / first:,.0f}",
            f"{len(files) / first / ideal:.2f}",
            "",
        ],
        [
            f"naive recipe (gzip-9 per image, {len(naive_files)} images, extrapolated)",
            f"{naive_rate:,.1f}",
            f"{naive_rate / ideal:.3f}",
            f"{naive_ratio:.2f}",
        ],
    ]
    if not args.no_variants:
        variants: list[tuple[str, dict[str, object]]] = [
            (
                "encoded original (JPEG bytes as is)",
                {"image": ImageConfig(layout="encoded", resize="none", size=None)},
            ),
            ("encoded jpeg q90, 224", {"image": ImageConfig(layout="encoded", encoding="jpeg")}),
            ("decoded 224 + gzip-4", {"compression": "gzip"}),
            ("decoded 224 + lzf", {"compression": "lzf"}),
        ]
        try:
            import hdf5plugin  # noqa: F401

            variants += [
                ("decoded 224 + blosc-lz4", {"compression": "blosc-lz4"}),
                ("decoded 224 + zstd-3", {"compression": "zstd"}),
            ]
        except ImportError:
            pass
        for name, kwargs in variants:
            path = tmp / "variant.h5"
            seconds, _ = timed(
                lambda kw=kwargs, path=path: pack(
                    root,
                    path,
                    config=PackConfig(**kw),  # type: ignore[arg-type]
                    workers=args.workers,
                    overwrite=True,
                )
            )
            rows.append(
                [
                    f"h5forge pack, {name} (one run)",
                    f"{len(files) / seconds:,.0f}",
                    f"{len(files) / seconds / ideal:.2f}",
                    f"{path.stat().st_size / src_bytes:.3f}",
                ]
            )
            path.unlink()
    report.add(table(["what", "images/s", "vs ideal", "file / source bytes"], rows))
    report.add(
        f"CPU per image: plain decode+resize {cpu_decode * 1e3:.2f} ms, h5forge pack "
        f"{cpu_pack * 1e3:.2f} ms (writer + workers, verification included): CPU "
        f"efficiency {cpu_decode / cpu_pack:.2f}."
    )
    report.add(
        f"pack / ideal = **{rate / ideal:.2f}x**, {verdict(rate / ideal, 0.85)}; "
        f"pack / parallel ideal = **{rate / parallel:.2f}x**; "
        f"pack / naive = **{rate / naive_rate:.0f}x**, {verdict(rate / naive_rate, 20)}"
    )
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
