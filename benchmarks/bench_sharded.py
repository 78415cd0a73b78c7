"""Sharded versions: a new version after 1% and 10% of the files changed, and a no-op, against a
full build; the bytes each writes; the storage of five successive versions.

One base version is built from the photo set as a sharded version (untimed). Two new sources
are made from it (hard links, so unchanged files keep their size and mtime; half of the
changed files added, half replaced: ``bench_incremental.changed_copy``). Timed in the same run,
interleaved, ``--repeat`` rounds, medians (no Prefect; the library's whole path,
:func:`h5forge.publish.sharded.build_sharded_version`: fingerprint, read the previous
version's index, pack, publish to a local store, fsync'd):

- full: a sharded version of the 1% source into an empty store (what a rebuild costs);
- one file: ``pack()`` of the same source into one file and ``publish_version()`` of it to an
  empty store (today's single-file versioned build, for reference: the same work, pack to
  publish, as the sharded build);
- incremental 1% / 10%: a new version of the base store (a hard-linked copy of it, untimed);
- no-op: the base source against the base store (finds nothing to do).

Then, untimed: the bytes each incremental version wrote (new shards + manifest + sources map)
against the bytes of the changed samples, and five successive 1% versions' storage (every
shard file under ``shards/``) against one full version's.

Targets (issue 29): 1% <= 0.05x the full build, 10% <= 0.2x, no-op <= 0.01x; bytes written
<= 1.2x the changed samples' bytes plus manifests; five 1% versions <= 1.1x one version.

    python -m benchmarks.bench_sharded --count 10000 --repeat 5   # the recorded run
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from benchmarks._common import image_root, interleave, median, parser, start_report, table, verdict
from benchmarks.bench_incremental import changed_copy
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.publish.release import publish_version
from h5forge.publish.shard_release import build_sharded_version
from h5forge.publish.sharded import DEFAULT_MAX_SHARD_SIZE

TARGETS = {"incremental 1%": 0.05, "incremental 10%": 0.2, "no-op": 0.01}


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(count=10_000, repeat=5)
    p.add_argument("--workers", type=int, default=None, help="pack workers (default: CPUs)")
    p.add_argument(
        "--max-shard-size", type=int, default=DEFAULT_MAX_SHARD_SIZE, help="bytes per shard"
    )
    args = p.parse_args()
    report = start_report("sharded versions: full build vs a new version of 1% and 10% changed")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-shard-"))
    config = PackConfig()
    kw = {"config": config, "max_shard_size": args.max_shard_size, "workers": args.workers}
    sample_bytes = 224 * 224 * 3
    try:
        print("building the base version ...", flush=True)
        base_store = tmp / "base"
        build_sharded_version(root, Location(str(base_store / "photos")), **kw)  # type: ignore[arg-type]
        sources = {
            pct: (tmp / f"src-{pct}", changed_copy(root, tmp / f"src-{pct}", pct / 100, pct))
            for pct in (1, 10)
        }
        written: dict[str, tuple[int, int]] = {}  # shards' bytes, the manifest folder's

        def incremental(pct: int) -> None:
            store = tmp / f"inc-{pct}"
            result = build_sharded_version(sources[pct][0], Location(str(store / "photos")), **kw)  # type: ignore[arg-type]
            assert result is not None
            manifest = store / "photos" / "v" / result.version
            written[f"{pct}%"] = (result.bytes_new, _tree_bytes(manifest))

        def full() -> None:
            build_sharded_version(sources[1][0], Location(str(tmp / "full" / "photos")), **kw)  # type: ignore[arg-type]

        def one_file() -> None:
            pack(sources[1][0], tmp / "one.h5", config=config, workers=args.workers, overwrite=True)
            publish_version(tmp / "one.h5", Location(str(tmp / "one" / "photos")))

        def no_op() -> None:
            if build_sharded_version(root, Location(str(base_store / "photos")), **kw) is not None:  # type: ignore[arg-type]
                raise SystemExit("the no-op build found a change")

        def settle(name: str) -> None:
            """Untimed: a fresh hard-linked copy of the base store for an incremental run, an
            empty store for a full one, and what earlier runs wrote on disk."""
            for folder in ("full", "inc-1", "inc-10"):
                shutil.rmtree(tmp / folder, ignore_errors=True)
            if name.startswith("incremental"):
                pct = name.split()[-1].rstrip("%")
                shutil.copytree(base_store, tmp / f"inc-{pct}", copy_function=os.link)
            (tmp / "one.h5").unlink(missing_ok=True)
            shutil.rmtree(tmp / "one", ignore_errors=True)
            os.sync()

        for f in root.rglob("*.jpg"):  # page cache warm for every variant
            f.read_bytes()
        times = interleave(
            {
                "full": full,
                "one file": one_file,
                "incremental 1%": lambda: incremental(1),
                "incremental 10%": lambda: incremental(10),
                "no-op": no_op,
            },
            args.repeat,
            before=settle,
        )
        f_s = median(times["full"])
        rows: list[list[object]] = [
            ["full sharded build (1% source)", f"{f_s:.2f}", "1.00x", "", "—"]
        ]
        o_s = median(times["one file"])
        rows.append(
            ["one file: pack() + publish_version()", f"{o_s:.2f}", f"{o_s / f_s:.2f}x", "", "—"]
        )
        for name in ("incremental 1%", "incremental 10%", "no-op"):
            s = median(times[name])
            key = name.split()[-1] if name != "no-op" else ""
            changed = sources[int(key[:-1])][1] if key else 0
            if key:
                (wrote, meta), share = written[key], written[key][0] / (changed * sample_bytes)
                bytes_cell = (
                    f"shards {wrote / 1e6:.1f} MB = {share:.2f}x of {changed:,} changed samples' "
                    f"bytes ({verdict(share, 1.2, at_most=True)}); manifest + map "
                    f"{meta / 1e3:.0f} kB"
                )
            else:
                bytes_cell = "0"
            ratio = s / f_s
            rows.append(
                [f"{name} ({changed:,} files)", f"{s:.3f}", f"**{ratio:.3f}x**", bytes_cell]
            )
            rows[-1].append(verdict(ratio, TARGETS[name], at_most=True))
        report.add(
            f"Source: {what}. Config: {config.to_json()}; workers {args.workers or 'all'}; "
            f"max_shard_size {args.max_shard_size:,}. Medians of {args.repeat} interleaved rounds."
        )
        report.add(table(["variant", "median s", "/ full", "bytes written", "target"], rows))

        print("five successive 1% versions ...", flush=True)
        chain = tmp / "chain"
        shutil.rmtree(chain, ignore_errors=True)
        shutil.copytree(base_store, chain / "store", copy_function=os.link)
        one_version = _tree_bytes(base_store / "photos" / "shards")
        current = root
        for step in range(5):
            nxt = chain / f"src-{step}"
            changed_copy(current, nxt, 0.01, 100 + step)
            build_sharded_version(
                nxt, Location(str(chain / "store" / "photos")), keep_versions=5, **kw
            )  # type: ignore[arg-type]
            current = nxt
        five = _tree_bytes(chain / "store" / "photos")
        ratio = five / one_version
        report.add(
            f"Storage: five successive versions, 1% changed each: {five / 1e6:.1f} MB (shards, "
            f"manifests, maps) vs one version's shards {one_version / 1e6:.1f} MB = "
            f"**{ratio:.3f}x** "
            f"({verdict(ratio, 1.1, at_most=True)}, target <= 1.1x)."
        )
        report.write(not args.no_record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
