"""Pack speed: h5forge vs its own decode + resize alone, vs today's pack, vs peer writers.

* **chosen kernel** = the pack's decode + resize (``ImageConfig()``: simplejpeg + torch's
  antialiased bilinear, shorter side 224 + centre crop), one core, CPU time, in this process;
  **ideal** = workers x that.
* **parallel** = the same kernel run by ``workers`` processes at once (a pre-started pool,
  only lengths sent back): what ``workers`` decoders really get from the machine at that
  moment (two vCPUs do not give twice one). A pack cannot beat it: it is the decode alone,
  without reading, hashing, writing or verifying. Target: pack >= 0.9x parallel.
* **h5forge** = ``h5forge.pack`` decoded 224 with ``workers`` processes, timed end to end:
  discovery, decoding, writing, full verification, sealing and fsync.
* **today's pack** (``--baseline DIR``, a checkout of the code before the change): the same
  pack by that code, in a child process started and warmed up once. Target: >= 1.5x.
  **From a script**: both trees' packs again, each in a child whose main is a script file
  that imports the packer, as a user's is (``python -c`` children have no main script for
  forkserver workers to run again; a script's workers run it, and its imports, per pack).
* **peers** (``--peers``, the ``bench`` extra): LitData ``optimize`` (``workers`` processes),
  Mosaic ``MDSWriter`` and WebDataset ``ShardWriter`` (one writer fed by ``workers`` decoding
  processes), every image through the pack's own kernel, in a child process (LitData changes
  the start method). Target: pack >= 1.5x the best.
* **Pillow recipe**: the plain Pillow decode + resize + crop, one core (the ideal before).
* **CPU per image**: CPU seconds of the whole process tree (writer and workers) per image.
* **naive** = one gzip-9 dataset per image, pixels through ``torch.Tensor(list(...))``, in
  one process; run on a subset, rate extrapolated.

All timed variants are interleaved, ``--repeat`` rounds in rotated order, medians. Further
variants (encoded, compressed, the Pillow kernel) are packed once each, for the layout
guidance in benchmarks/README.md.

    python -m benchmarks.bench_pack               # targets: >= 0.9 x parallel, >= 20 x naive
    python -m benchmarks.bench_pack --images "$(python -m benchmarks.realphotos)" \
        --baseline /tmp/h5forge-main --peers
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks._child import Child
from benchmarks._common import (
    image_root,
    median,
    parser,
    start_report,
    table,
    timed,
    tree_cpu,
    verdict,
)
from benchmarks.photoset import image_files

SIDE = 224

# The first line of a user's pack script (benchmarks._child runs the rest under a main guard).
_SCRIPT = "from h5forge.pack.writer import pack"


def decode_resize(path: str | Path) -> bytes:
    """The plain recipe: decode, RGB, shorter side to 224 (bilinear), centre crop 224."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        nw, nh = (SIDE, int(SIDE * h / w)) if w <= h else (int(SIDE * w / h), SIDE)
        im = im.resize((nw, nh), Image.Resampling.BILINEAR)
        left, top = int(round((nw - SIDE) / 2.0)), int(round((nh - SIDE) / 2.0))
        return np.asarray(im.crop((left, top, left + SIDE, top + SIDE))).tobytes()


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


def _kernel_count(paths: list[str]) -> int:
    from benchmarks._peers import decoded_sample

    return sum(decoded_sample(p).nbytes for p in paths)


def _labels(files: list[Path], root: Path) -> list[int]:
    names = sorted({f.relative_to(root).parts[0] for f in files})
    return [names.index(f.relative_to(root).parts[0]) for f in files]


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
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a checkout of h5forge before this change (git worktree add DIR main): its pack "
        "runs in a child process, interleaved with this tree's",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="also time LitData optimize, Mosaic MDSWriter and WebDataset ShardWriter (the "
        "bench extra), each fed the pack's own decode + resize by as many processes",
    )
    args = p.parse_args()
    from h5forge.pack.writer import pack

    report = start_report("pack: h5forge vs the decode+resize alone, today's pack and peers")
    root, what = image_root(args)
    files = image_files(root)
    src_bytes = sum(f.stat().st_size for f in files)
    subset = files[:: max(1, len(files) // 500)]  # spread over the set, >= 500 files
    for f in files:  # page cache warm for every run
        f.read_bytes()
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-pack-"))
    out = tmp / "decoded.h5"
    first, _ = timed(lambda: pack(root, out, workers=args.workers, overwrite=True))
    cpu: dict[str, list[float]] = {"decode": [], "kernel": [], "pack": []}

    def one_core(fn: Callable[[Path], object], key: str) -> Callable[[], None]:
        def run() -> None:
            t0 = time.process_time()
            for f in subset:
                fn(f)
            cpu[key].append((time.process_time() - t0) / len(subset))

        return run

    def pack_run() -> None:
        c0 = tree_cpu()
        pack(root, out, workers=args.workers, overwrite=True)
        cpu["pack"].append((tree_cpu() - c0) / len(files))

    from benchmarks._peers import decoded_sample, one_thread

    one_thread()  # the one-core rows run here

    variants: dict[str, Callable[[], object]] = {
        "one-core Pillow recipe": one_core(decode_resize, "decode"),
        "one-core chosen kernel": one_core(lambda f: decoded_sample(str(f)), "kernel"),
    }
    children: list[Child] = []
    here = Path(__file__).resolve().parent.parent
    shares = [[str(f) for f in files[i :: args.workers * 8]] for i in range(args.workers * 8)]
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(args.workers, initializer=one_thread) as decoders:
        decoders.map(_kernel_count, [[str(files[0])]] * args.workers)  # started, warm
        variants["parallel chosen kernel"] = lambda: decoders.map(
            _kernel_count, shares, chunksize=1
        )
        variants["h5forge pack"] = pack_run
        if args.baseline is not None:
            base = Child(args.baseline.resolve())
            children.append(base)
            base_out = str(tmp / "baseline.h5")
            kw = {"src": str(root), "out": base_out, "workers": args.workers, "overwrite": True}
            base.call("h5forge.pack.writer:pack", **kw)  # warm: imports, fork server
            variants["today's pack (baseline)"] = lambda: base.call(
                "h5forge.pack.writer:pack", **kw
            )
            # As a user's script runs them: a main file that imports the packer (its workers
            # run it again), each tree in its own process.
            for name, tree in (("h5forge", here), ("today's", args.baseline.resolve())):
                child = Child(tree, script=tmp / f"{name[:5]}_script.py", prelude=_SCRIPT)
                children.append(child)
                script_kw = {**kw, "out": str(tmp / f"{name[:5]}_script.h5")}
                child.call("h5forge.pack.writer:pack", **script_kw)  # warm
                variants[f"{name} pack, from a script"] = lambda child=child, script_kw=script_kw: (
                    child.call("h5forge.pack.writer:pack", **script_kw)
                )
        if args.peers:
            peers = Child(here)
            children.append(peers)
            names = [str(f) for f in files]
            labels = _labels(files, root)
            for name, call in (
                ("LitData optimize", "benchmarks._peers:optimize_litdata"),
                ("Mosaic MDSWriter", "benchmarks._peers:write_mds_files"),
                ("WebDataset ShardWriter", "benchmarks._peers:write_wds_files"),
            ):
                peer_kw = {
                    "files": names,
                    "labels": labels,
                    "out": str(tmp / name.split()[0].lower()),
                    "workers": args.workers,
                }
                peers.call(call, **peer_kw)  # warm
                variants[name] = lambda call=call, peer_kw=peer_kw: peers.call(call, **peer_kw)
        seconds, tree = _rounds(variants, args.repeat)
        for child in children:
            child.close()
    one_core_pillow = len(subset) / median(seconds["one-core Pillow recipe"])
    one_core_kernel = len(subset) / median(seconds["one-core chosen kernel"])
    parallel = len(files) / median(seconds["parallel chosen kernel"])
    rate = len(files) / median(seconds["h5forge pack"])
    ideal = args.workers * one_core_kernel
    cpu_decode, cpu_kernel, cpu_pack = (median(cpu[k]) for k in ("decode", "kernel", "pack"))
    naive_files = files[:: max(1, len(files) // args.naive_count)][: args.naive_count]
    naive_s, _ = timed(lambda: naive_pack(naive_files, tmp / "naive.h5"))
    naive_rate = len(naive_files) / naive_s
    naive_ratio = (tmp / "naive.h5").stat().st_size / sum(f.stat().st_size for f in naive_files)
    size = out.stat().st_size

    report.add(
        f"Input: {what}. Workers: {args.workers}. Page cache warm. Rates: median of "
        f"{args.repeat} interleaved rounds (one-core rows: CPU time of this process)."
    )
    rows = [
        ["one-core Pillow recipe (decode, resize, crop)", f"{one_core_pillow:,.0f}", "", ""],
        ["one-core chosen kernel (simplejpeg + torch)", f"{one_core_kernel:,.0f}", "", ""],
        [f"ideal = {args.workers} x one-core chosen kernel", f"{ideal:,.0f}", "", ""],
        [
            f"parallel: {args.workers} processes running the chosen kernel at once",
            f"{parallel:,.0f}",
            f"{parallel / rate:.2f}",
            "",
        ],
        [
            "h5forge pack, decoded 224, median",
            f"{rate:,.0f}",
            "1.00",
            f"{size / src_bytes:.2f}",
        ],
        [
            "h5forge pack, first run in the process (pool start-up)",
            f"{len(files) / first:,.0f}",
            f"{len(files) / first / rate:.2f}",
            "",
        ],
    ]
    peer_rates: dict[str, float] = {}
    for name in seconds:
        if name.startswith(("today", "h5forge pack, from", "LitData", "Mosaic", "WebDataset")):
            r = len(files) / median(seconds[name])
            if not name.startswith(("today", "h5forge")):
                peer_rates[name] = r
            rows.append([name, f"{r:,.0f}", f"{r / rate:.2f}", ""])
    cpu_ms = {
        name: median(tree[name]) / len(files) * 1e3
        for name in seconds
        if not name.startswith("one-core")
    }
    rows.append(
        [
            f"naive recipe (gzip-9 per image, {len(naive_files)} images, extrapolated)",
            f"{naive_rate:,.1f}",
            f"{naive_rate / rate:.3f}",
            f"{naive_ratio:.2f}",
        ]
    )
    if not args.no_variants:
        rows += _variant_rows(root, tmp, files, src_bytes, args.workers, rate)
    report.add(table(["what", "images/s", "vs h5forge pack", "file / source bytes"], rows))
    report.add(
        "CPU ms per image, whole process tree (median; load-independent): "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in cpu_ms.items())
        + "."
    )
    report.add(
        f"CPU per image: Pillow recipe {cpu_decode * 1e3:.2f} ms, chosen kernel "
        f"{cpu_kernel * 1e3:.2f} ms, h5forge pack {cpu_pack * 1e3:.2f} ms (writer + workers, "
        f"verification included): CPU efficiency vs the kernel {cpu_kernel / cpu_pack:.2f}."
    )
    verdicts = [
        f"pack / parallel chosen kernel = **{rate / parallel:.2f}x**, "
        f"{verdict(rate / parallel, 0.9)}",
        f"pack / ideal = **{rate / ideal:.2f}x**",
        f"pack / naive = **{rate / naive_rate:.0f}x**, {verdict(rate / naive_rate, 20)}",
    ]
    if "today's pack (baseline)" in seconds:
        base = "today's pack (baseline)"
        base_rate = len(files) / median(seconds[base])
        per_round = median(
            [b / a for a, b in zip(seconds["h5forge pack"], seconds[base], strict=True)]
        )
        verdicts.insert(
            0,
            f"pack / today's pack = **{rate / base_rate:.2f}x** (median of the rounds' own "
            f"ratios {per_round:.2f}x; by CPU per image "
            f"{cpu_ms[base] / cpu_ms['h5forge pack']:.2f}x), {verdict(rate / base_rate, 1.5)}",
        )
        head_s, base_s = (
            seconds["h5forge pack, from a script"],
            seconds["today's pack, from a script"],
        )
        script_ratio = median(base_s) / median(head_s)
        script_cpu = cpu_ms["today's pack, from a script"] / cpu_ms["h5forge pack, from a script"]
        verdicts.insert(
            1,
            f"from a script: pack / today's pack = **{script_ratio:.2f}x** (rounds' own "
            f"{median([b / a for a, b in zip(head_s, base_s, strict=True)]):.2f}x; by CPU "
            f"{script_cpu:.2f}x), {verdict(script_ratio, 1.5)}",
        )
    if peer_rates:
        best_name = max(peer_rates, key=lambda k: peer_rates[k])
        ratio = rate / peer_rates[best_name]
        verdicts.append(f"pack / best peer ({best_name}) = **{ratio:.2f}x**, {verdict(ratio, 1.5)}")
    report.add("; ".join(verdicts))
    shutil.rmtree(tmp)
    report.write(not args.no_record)


def _rounds(
    variants: dict[str, Callable[[], object]], repeat: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds and CPU seconds (this process tree: workers, child processes) of every
    variant, ``repeat`` rounds, the order rotated by one each round so that drift in load hits
    all alike and every variant takes every place."""
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            c0 = tree_cpu()
            took, _ = timed(variants[name])
            seconds[name].append(took)
            cpu[name].append(tree_cpu() - c0)
            print(f"  {name}: {took:.3f} s, {cpu[name][-1]:.3f} CPU s", flush=True)
    return seconds, cpu


def _variant_rows(
    root: Path, tmp: Path, files: list[Path], src_bytes: int, workers: int, rate: float
) -> list[list[str]]:
    """One run each of the encoded and compressed layouts (layout guidance, README)."""
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig

    variants: list[tuple[str, dict[str, object]]] = [
        (
            "encoded original (JPEG bytes as is)",
            {"image": ImageConfig(layout="encoded", resize="none", size=None)},
        ),
        ("encoded jpeg q90, 224", {"image": ImageConfig(layout="encoded", encoding="jpeg")}),
        ("decoded 224 + gzip-4", {"compression": "gzip"}),
        ("decoded 224 + lzf", {"compression": "lzf"}),
        (
            "decoded 224, Pillow decoder and kernel",
            {"image": ImageConfig(decoder="pillow", resample="pillow")},
        ),
    ]
    try:
        import hdf5plugin  # noqa: F401

        variants += [
            ("decoded 224 + blosc-lz4", {"compression": "blosc-lz4"}),
            ("decoded 224 + zstd-3", {"compression": "zstd"}),
        ]
    except ImportError:
        pass
    rows = []
    for name, kwargs in variants:
        path = tmp / "variant.h5"
        seconds, _ = timed(
            lambda kw=kwargs, path=path: pack(
                root,
                path,
                config=PackConfig(**kw),  # type: ignore[arg-type]
                workers=workers,
                overwrite=True,
            )
        )
        rows.append(
            [
                f"h5forge pack, {name} (one run)",
                f"{len(files) / seconds:,.0f}",
                f"{len(files) / seconds / rate:.2f}",
                f"{path.stat().st_size / src_bytes:.3f}",
            ]
        )
        path.unlink()
    return rows


if __name__ == "__main__":
    main()
