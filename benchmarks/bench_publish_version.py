"""A versioned publish hashes the local file once: against the three hashes it took before.

``publish_version`` names the version by the file's sha256 and ``publish`` checks the copy at
the destination against it. The build's publish task used to hash the file to name the
version's folder, then ``publish_version`` hashed it again, then ``publish`` a third time; now
the task's one hash is handed down (``sha256=``). Timed in the same run, interleaved, best of
``--repeat``, each run into a fresh local asset (page cache warm, as after a pack):

- now: one ``Location.sha256()`` and ``publish_version(..., sha256=)`` (the task's path);
- before: two more ``Location.sha256()`` calls first, then ``publish_version`` hashing it itself,
  which is the work the old path did;
- floor: one hash, a plain copy and a hash of the copy (the least a verified publish costs).

Target: now <= 0.75x before (two of the five full passes over the bytes are gone).

    python -m benchmarks.bench_publish_version --mib 256
"""

from __future__ import annotations

import os
import shutil
import tempfile
from itertools import count
from pathlib import Path

from benchmarks._common import best, interleave, parser, start_report, table, verdict
from h5forge.location import Location
from h5forge.publish.release import publish_version

TARGET = 0.75


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256, help="size of the published file, MiB")
    args = p.parse_args()
    report = start_report("Versioned publish: one local hash instead of three")
    with tempfile.TemporaryDirectory(prefix="h5bench-pub-") as tmp:
        work = Path(tmp)
        local = work / "asset.h5"
        with open(local, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(2**20))
        runs = count()

        def fresh() -> str:
            folder = work / f"pub-{next(runs)}"
            folder.mkdir()
            return str(folder / "set.h5")

        def now() -> None:
            publish_version(local, Location(fresh()), sha256=Location.of(local).sha256())

        def before() -> None:
            Location.of(local).sha256()
            Location.of(local).sha256()
            publish_version(local, Location(fresh()))

        def floor() -> None:
            Location.of(local).sha256()
            out = fresh()
            shutil.copyfile(local, out)
            Location.of(out).sha256()

        times = interleave({"now": now, "before": before, "floor": floor}, args.repeat)
        for folder in work.glob("pub-*"):
            shutil.rmtree(folder)
    b = {k: best(v) for k, v in times.items()}
    rows = [
        [
            "now (1 local hash)",
            b["now"],
            b["now"] / b["before"],
            verdict(b["now"] / b["before"], TARGET, at_most=True),
        ],
        ["before (3 local hashes)", b["before"], 1.0, ""],
        ["floor (hash, copy, hash)", b["floor"], b["floor"] / b["before"], ""],
    ]
    report.add(f"File: {args.mib} MiB of random bytes, local folder; best of {args.repeat}.")
    report.add(table(["variant", "best s", "/ before", "target"], rows))
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
