"""Memory and growth: pack 1k vs 10k images, reader worker memory, open time vs N.

* **pack**: each pack runs in a fresh process, after a 16-image warm-up pack in that process
  (the fork server started and the decoders imported, as in any process that packs more than
  once); the peak RSS of its whole process tree (writer, fork server, workers; sampled from
  /proc every 20 ms) and its time. 10k images are small (JPEG 96x128, packed decoded 64x64) to
  keep the run short; 1k is every tenth of them. Time per image is reported raw and net of
  the fixed cost of a pack (a warm 16-image pack: pool start, file creation, seal, fsync),
  which a 1k pack would otherwise spread over fewer images.
* **reader**: a DataLoader (2 workers, batch 64, shuffled) over a decoded 224 file, two epochs;
  each worker's peak RSS, USS (private memory) and PSS (shared pages divided among the
  processes mapping them), and the same for a control Dataset that
  returns zero tensors of the same shape (what a torch worker costs with no reader at all).
* **open**: ``H5ImageDataset(path)`` (open + index) on files of 1k, 10k and 100k tiny samples.

    python -m benchmarks.bench_memory     # targets: pack peak grows <= 50 MB 1k -> 10k; worker
                                          # <= 200 MB; time/image within 10%; open < 50 ms, flat
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    HERE,
    best,
    image_root,
    median,
    parser,
    peak_tree_rss,
    start_report,
    table,
    verdict,
)

MB = 1e6
_CHILD = """
import json, sys, time
from dataclasses import replace
from h5forge.discover.catalog import discover
from h5forge.preprocess.config import ImageConfig
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
root, n, out, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
catalog = discover(root)
warm = replace(catalog, samples=catalog.samples[1::len(catalog.samples) // 16][:16])  # warm-up
config = PackConfig(ImageConfig(size=(64, 64)))
pack(warm, out + ".warm", config=config, workers=workers, overwrite=True)
catalog = replace(catalog, samples=catalog.samples[::len(catalog.samples) // n][:n])
t0 = time.perf_counter()
result = pack(catalog, out, config=config, workers=workers, overwrite=True)
print(json.dumps({"seconds": time.perf_counter() - t0, "n": result.num_samples}))
"""


def _pack_in_child(root: Path, n: int, out: Path, workers: int) -> tuple[float, int]:
    """(seconds, peak RSS of the child's process tree) of one pack in a fresh process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), str(n), str(out), str(workers)],
        stdout=subprocess.PIPE,
        cwd=HERE.parent,
    )
    with peak_tree_rss(proc.pid) as peak:
        stdout, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"pack of {n} images failed (exit {proc.returncode})")
    return float(json.loads(stdout)["seconds"]), peak[0]


def _proc_memory(pid: int) -> tuple[int, int, int]:
    """(RSS, USS, PSS) in bytes of one process. PSS counts each shared page divided by the
    number of processes mapping it: what the process accounts for in a fork tree."""
    rss = uss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                kb = int(value.split()[0]) * 1024 if value.split() else 0
                if key == "Rss":
                    rss = kb
                elif key == "Pss":
                    pss = kb
                elif key in ("Private_Clean", "Private_Dirty"):
                    uss += kb
    except (OSError, ValueError, IndexError):
        pass
    return rss, uss, pss


def _worker_peaks(
    ds: Any, method: str, epochs: int, *, batches: bool = False
) -> tuple[int, int, int]:
    """Peak RSS, USS and PSS over the DataLoader's worker processes during ``epochs`` epochs;
    ``batches``: through ``ds.loader()`` (whole batches in reusable slots) instead of
    ``DataLoader(ds, batch_size=64)``."""
    import torch
    from torch.utils.data import DataLoader

    options: dict[str, Any] = {
        "shuffle": True,
        "num_workers": 2,
        "multiprocessing_context": method,
        "persistent_workers": True,
        "generator": torch.Generator().manual_seed(0),
    }
    import psutil

    loader = ds.loader(64, **options) if batches else DataLoader(ds, batch_size=64, **options)
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    workers: dict[int, bool] = {}  # pid -> a DataLoader worker (not multiprocessing's helpers)
    peaks = [0, 0, 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for child in me.children():
                if child.pid in before:
                    continue
                if child.pid not in workers:
                    try:
                        line = " ".join(child.cmdline())
                        workers[child.pid] = not any(
                            helper in line for helper in ("resource_tracker", "forkserver")
                        )
                    except psutil.Error:
                        continue
                if workers[child.pid]:
                    for k, value in enumerate(_proc_memory(child.pid)):
                        peaks[k] = max(peaks[k], value)
            stop.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    it = iter(loader)
    try:
        for _ in it:
            pass
        for _ in range(epochs - 1):
            for _ in loader:
                pass
    finally:
        stop.set()
        t.join()
    del it, loader
    return peaks[0], peaks[1], peaks[2]


def _tiny_file(tmp: Path, n: int) -> Path:
    """A decoded file of ``n`` 8x8 samples, packed by h5forge from one tiny PNG."""
    from PIL import Image

    from h5forge.discover.catalog import Catalog, Sample
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig

    png = tmp / "tiny.png"
    if not png.exists():
        Image.new("RGB", (8, 8), (200, 100, 50)).save(png)
    classes = tuple(f"c{k}" for k in range(10))
    samples = tuple(Sample(str(png), f"c{i % 10}/{i:07d}.png", i % 10, "") for i in range(n))
    catalog = Catalog(
        str(tmp), tuple(sorted(samples, key=lambda s: (s.label, s.relpath))), classes, (), {}
    )
    out = tmp / f"tiny-{n}.h5"
    pack(catalog, out, config=PackConfig(ImageConfig(size=(8, 8))), workers=2, overwrite=True)
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--open-sizes", default="1000,10000,100000")
    args = p.parse_args()
    from benchmarks.photoset import ensure_photoset

    report = start_report("memory and growth: pack 1k vs 10k, reader workers, open time")
    small = ensure_photoset(count=10_000, seed=args.seed, size=(96, 128))
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-memory-"))
    try:
        # --- pack: fresh process per run, interleaved
        runs: dict[int, list[tuple[float, int]]] = {16: [], 1000: [], 10_000: []}
        for _ in range(args.repeat):
            for n in runs:
                runs[n].append(_pack_in_child(small, n, tmp / f"pack-{n}.h5", args.workers))
                print(
                    f"  pack {n}: {runs[n][-1][0]:.2f} s, peak {runs[n][-1][1] / MB:.0f} MB",
                    flush=True,
                )
        fixed = best([s for s, _ in runs[16]])
        t1k, t10k = best([s for s, _ in runs[1000]]), best([s for s, _ in runs[10_000]])
        peak1k = median([r for _, r in runs[1000]])
        peak10k = median([r for _, r in runs[10_000]])
        raw = (t10k / 10_000) / (t1k / 1000)
        net = ((t10k - fixed) / 10_000) / ((t1k - fixed) / 1000)
        growth = (peak10k - peak1k) / MB
        report.add(
            f"Pack input: {small.name} (10,000 JPEGs 96x128, q90) packed decoded 64x64 "
            f"with {args.workers} workers; each pack in a fresh process; best time and "
            f"median peak of {args.repeat} runs, interleaved."
        )
        report.add(
            table(
                [
                    "images",
                    "best s",
                    "ms / image",
                    "ms / image net of start-up",
                    "peak RSS, all processes (MB)",
                    "peaks of every run (MB)",
                ],
                [
                    [
                        n,
                        best([s for s, _ in r]),
                        1e3 * best([s for s, _ in r]) / n,
                        "" if n == 16 else f"{1e3 * (best([s for s, _ in r]) - fixed) / n:.3f}",
                        median([x for _, x in r]) / MB,
                        ", ".join(f"{x / MB:.0f}" for _, x in r),
                    ]
                    for n, r in runs.items()
                ],
            )
        )

        # --- reader workers
        import torch  # noqa: F401  (after the packs: their children must not inherit it)

        from benchmarks._datasets import Constant
        from h5forge import H5ImageDataset
        from h5forge.pack.writer import pack

        root, what = image_root(args)
        decoded = pack(root, tmp / "decoded224.h5", workers=args.workers)
        mem_rows = []
        worst = worker_rss = worker_pss = 0.0
        for method in ("fork", "spawn"):
            h5 = _worker_peaks(H5ImageDataset(decoded.path), method, 2)
            bat = _worker_peaks(H5ImageDataset(decoded.path), method, 2, batches=True)
            ctl = _worker_peaks(Constant(decoded.num_samples, (3, 224, 224)), method, 2)
            worst = max(worst, (h5[0] - ctl[0]) / MB, (bat[0] - ctl[0]) / MB)
            if method == "fork":
                worker_rss = max(h5[0], bat[0]) / MB
                worker_pss = max(h5[2], bat[2]) / MB
            mem_rows += [
                [method, "H5ImageDataset, DataLoader(batch_size=64)", *(v / MB for v in h5)],
                [
                    method,
                    "H5ImageDataset.loader(64) (slots shared with the main process)",
                    *(v / MB for v in bat),
                ],
                [method, "control (zeros, same shapes)", *(v / MB for v in ctl)],
                [
                    method,
                    "**h5forge's share** (difference, DataLoader)",
                    *((a - b) / MB for a, b in zip(h5, ctl, strict=True)),
                ],
                [
                    method,
                    "**h5forge's share** (difference, loader())",
                    *((a - b) / MB for a, b in zip(bat, ctl, strict=True)),
                ],
            ]
        report.add(
            f"Reader: {what}, packed decoded 224 ({decoded.num_samples} samples, "
            f"{decoded.bytes / MB:.0f} MB); DataLoader 2 workers, batch 64, shuffled, "
            "two epochs; peak over both workers."
        )
        report.add(
            table(
                [
                    "start method",
                    "dataset",
                    "worker peak RSS (MB)",
                    "worker peak USS (MB)",
                    "worker peak PSS (MB)",
                ],
                mem_rows,
            )
        )

        # --- open time vs N
        open_rows = []
        opens = {}
        for n in (int(x) for x in args.open_sizes.split(",")):
            path = _tiny_file(tmp, n)
            H5ImageDataset(path)  # warm: imports, page cache
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                ds = H5ImageDataset(path)
                len(ds)
                times.append(time.perf_counter() - t0)
            opens[n] = best(times)
            open_rows.append(
                [
                    f"{n:,}",
                    f"{opens[n] * 1e3:.2f}",
                    f"{median(times) * 1e3:.2f}",
                    f"{os.path.getsize(path) / MB:.1f}",
                ]
            )
            print(f"  open {n}: {opens[n] * 1e3:.2f} ms", flush=True)
        report.add(
            "Open: `H5ImageDataset(path)` + `len()` (file opened, header checked, index "
            "loaded), in this process after one warm-up open, best of 7."
        )
        report.add(table(["samples", "best ms", "median ms", "file MB"], open_rows))
        largest = max(opens)
        flat = opens[largest] / opens[min(opens)]
        report.add(
            "\n".join(
                [
                    f"- pack peak RSS growth 1k -> 10k = **{growth:+.0f} MB**, "
                    f"{verdict(growth, 50, at_most=True)}",
                    f"- pack time per image 10k / 1k = **{net:.2f}** net of the {fixed:.2f} s "
                    "start-up "
                    f"({raw:.2f} raw), {verdict(net, 1.10, at_most=True)}",
                    f"- reader worker (fork) peak PSS = **{worker_pss:.0f} MB** "
                    f"({verdict(worker_pss, 200, at_most=True)}), peak RSS {worker_rss:.0f} "
                    "MB (counts "
                    "every page shared with the parent in full; a torch worker doing nothing "
                    "has about "
                    "that much); h5forge's share of the RSS over a torch "
                    f"worker doing nothing = **{worst:.0f} MB** "
                    f"({verdict(worst, 200, at_most=True)})",
                    f"- open at {largest:,} samples = **{opens[largest] * 1e3:.1f} ms** "
                    f"({verdict(opens[largest] * 1e3, 50, at_most=True)}), {flat:.1f}x the "
                    f"{min(opens):,}-sample open",
                ]
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
