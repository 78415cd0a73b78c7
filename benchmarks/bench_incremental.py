"""Incremental pack against a full rebuild, after 1% and 10% of the files changed, and a no-op.

One previous version is packed from the photo set (untimed). Two new sources are made from it
(hard links, so the unchanged files keep their size and mtime): in each, half of the changed
files are added (new names) and half replaced (same name, another image's bytes, a new mtime).
Timed in the same run, interleaved, best of ``--repeat``, pack only (no Prefect, no upload);
before each run, untimed, its previous output is deleted and ``os.sync()`` puts what the other
runs wrote on disk, so no run pays for another's writeback:

- full: ``pack()`` of the 1% source from scratch (what a rebuild costs);
- incremental 1% / 10%: a stat walk of the new source (``size:mtime_ns`` per file),
  :func:`h5forge.pack.reuse.unchanged_paths` against the previous walk, and
  ``pack(reuse=Reuse(previous file, unchanged))``;
- no-op: the stat walk and the compare alone (there is no ``h5forge.fetch.fingerprint`` in
  this tree, so the fingerprint is this stat walk of the folder), which finds nothing changed.

- floor: a durable kernel copy (``copy_file_range``, then ``fsync``) of the whole previous
  file, unchecked: what writing the reused bytes once costs on this disk, the bound of any
  copy-based incremental build that commits its file (ext4 copies every byte; XFS and btrfs
  share blocks through the same call).

``--layout encoded`` stores each image re-encoded as a JPEG (q90) after the same resize,
instead of decoded pixels: about ten times fewer bytes to copy, the same decode and resize
for new files; the default is decoded 224 x 224.

Targets (issue 13): incremental 1% <= 0.05x the full build, 10% <= 0.2x, no-op <= 0.02x.
Every incremental file is checked against the full rebuild's sample count and digests.

    python -m benchmarks.bench_incremental --count 2000   # the recorded run
    python -m benchmarks.bench_incremental                # 10,000 generated photos
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np

from benchmarks._common import best, image_root, interleave, parser, start_report, table, verdict
from h5forge.asset.range_copy import RangeCopy
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse, unchanged_paths
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig

TARGETS = {"incremental 1%": 0.05, "incremental 10%": 0.2, "no-op": 0.02}


def stat_walk(root: Path) -> dict[str, str]:
    """``relpath -> "size:mtime_ns"`` of every file under ``root``: the change fingerprint."""
    out: dict[str, str] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
            out[rel] = f"{st.st_size}:{st.st_mtime_ns}"
    return out


def changed_copy(root: Path, dest: Path, fraction: float, seed: int) -> int:
    """Hard-link ``root`` into ``dest``, then add and replace ``fraction`` of its files."""
    shutil.copytree(root, dest, copy_function=os.link)
    files = sorted(p for p in dest.rglob("*.jpg"))
    k = max(2, round(len(files) * fraction))
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(files), size=k, replace=False).tolist()
    for n, i in enumerate(picks):
        other = files[(i + len(files) // 2) % len(files)].read_bytes()
        if n % 2:  # replaced: a new file under the same name (never written through the link)
            files[i].unlink()
            files[i].write_bytes(other)
        else:  # added
            files[i].with_name(f"added-{n}.jpg").write_bytes(other)
    return k


def _same(a: PackResult, b: PackResult) -> None:
    with h5py.File(a.path, "r") as x, h5py.File(b.path, "r") as y:
        for name in ("digests", "labels", "paths", "byte_ranges"):
            if not np.array_equal(x[name][()], y[name][()]):
                raise SystemExit(f"{a.path} and {b.path} differ in /{name}")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(count=10_000)
    p.add_argument("--workers", type=int, default=None, help="pack workers (default: CPUs)")
    p.add_argument("--layout", choices=("decoded", "encoded"), default="decoded")
    args = p.parse_args()
    report = start_report("incremental pack: full rebuild vs reuse of the previous version")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-incr-"))
    image = ImageConfig(layout="encoded", encoding="jpeg") if args.layout == "encoded" else None
    config = PackConfig(image=image or ImageConfig())
    kw = {"workers": args.workers, "overwrite": True}
    try:
        print("packing the previous version ...", flush=True)
        previous = pack(root, tmp / "previous.h5", config=config, **kw)  # type: ignore[arg-type]
        before = stat_walk(root)
        sources = {
            pct: (tmp / f"src-{pct}", changed_copy(root, tmp / f"src-{pct}", pct / 100, pct))
            for pct in (1, 10)
        }
        results: dict[str, PackResult] = {}

        def incremental(pct: int) -> None:
            src = sources[pct][0]
            unchanged = unchanged_paths(before, stat_walk(src))
            reuse = Reuse(previous.path, unchanged)
            results[f"{pct}%"] = pack(src, tmp / f"inc-{pct}.h5", config=config, reuse=reuse, **kw)  # type: ignore[arg-type]

        def full() -> None:
            results["full"] = pack(sources[1][0], tmp / "full.h5", config=config, **kw)  # type: ignore[arg-type]

        def floor() -> None:
            size = os.path.getsize(previous.path)
            src = os.open(previous.path, os.O_RDONLY)
            dst = os.open(tmp / "floor.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                RangeCopy()(src, dst, 0, 0, size)
                os.fsync(dst)  # a pack commits its file: the copy is not done until it is durable
            finally:
                os.close(src)
                os.close(dst)

        def no_op() -> None:
            if len(unchanged_paths(before, stat_walk(root))) != len(before):
                raise SystemExit("the no-op walk found a change")

        outputs = {
            "full": "full.h5",
            "incremental 1%": "inc-1.h5",
            "incremental 10%": "inc-10.h5",
            "floor": "floor.bin",
        }

        def settle(name: str) -> None:
            """Each run starts on a quiet disk: its previous output is deleted, and what the
            other variants wrote is on disk, outside every timing."""
            if name in outputs:
                with contextlib.suppress(FileNotFoundError):
                    (tmp / outputs[name]).unlink()
            os.sync()

        for f in root.rglob("*.jpg"):  # page cache warm for every variant
            f.read_bytes()
        times = interleave(
            {
                "full": full,
                "incremental 1%": lambda: incremental(1),
                "incremental 10%": lambda: incremental(10),
                "no-op": no_op,
                "floor": floor,
            },
            args.repeat,
            before=settle,
        )
        _same(results["1%"], results["full"])
        f_s = best(times["full"])
        rows: list[list[object]] = [["full rebuild (1% source)", f"{f_s:.2f}", "1.00x", "", "—"]]
        for name, key in (("incremental 1%", "1%"), ("incremental 10%", "10%"), ("no-op", "")):
            s = best(times[name])
            res = results.get(key)
            counts = f"{res.reused:,} of {res.num_samples:,}" if res else "—"
            changed = f"{sources[int(key[:-1])][1]:,} files" if key else "0"
            ratio = s / f_s
            rows.append([f"{name} ({changed})", f"{s:.3f}", f"**{ratio:.3f}x**", counts])
            rows[-1].append(verdict(ratio, TARGETS[name], at_most=True))
        fl = best(times["floor"])
        rows.append(
            ["floor: durable kernel copy of the previous file", f"{fl:.3f}", f"{fl / f_s:.3f}x"]
        )
        rows[-1] += ["—", "—"]
        report.add(f"Source: {what}. Config: {config.to_json()}; workers {args.workers or 'all'}.")
        report.add(table(["variant", "best s", "/ full", "samples reused", "target"], rows))
        report.write(not args.no_record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
