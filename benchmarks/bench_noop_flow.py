"""The versioned build flow: a full build against a no-op run, Prefect start-up reported apart.

Issue 13's third target: a scheduled run over a source that did not change ends "unchanged"
and publishes nothing in <= 0.02x of a full build's time, excluding Prefect start-up. Both runs
are the real ``build_dataset`` flow (fetch, discover, pack, verify, smoke-load, publish for the
full one; the source fingerprint against the latest version's sidecar for the no-op) on a
local folder, published to a local destination, against one Prefect test server
(``prefect_test_harness``), whose start-up is timed and reported on its own.

- full: a versioned build to a fresh destination (best of ``--repeat``, each to its own);
- no-op: the same source built again to the last of them (best of ``--repeat``); it must
  report ``unchanged`` and leave the version where it was;
- an empty flow run (a ``@flow`` that returns at once), the fixed cost of any Prefect flow run
  against this server (creating the run, its states, and the heartbeat thread's join at the
  end, which waits out its current 1 s sleep): reported, and subtracted for the "net" ratio.

    python -m benchmarks.bench_noop_flow --count 10000 --repeat 3
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks._common import best, image_root, parser, start_report, table, verdict

TARGET = 0.02


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(count=10_000)
    p.add_argument("--startup-timeout", type=float, default=180.0, help="Prefect's start bound")
    args = p.parse_args()
    report = start_report("versioned build flow: full build vs no-op run (Prefect start apart)")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-noop-"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    t0 = time.perf_counter()
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    from h5forge.flows.build import BuildConfig, build_dataset

    imports = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=int(args.startup_timeout)):
            startup = time.perf_counter() - t1
            full_s: list[float] = []
            noop_s: list[float] = []
            dest = ""
            for i in range(args.repeat):
                dest = str(tmp / f"pub-{i}" / "photos.h5")
                cfg = BuildConfig(source=str(root), destination=dest, versioned=True)
                t = time.perf_counter()
                first = build_dataset(cfg, cache_dir=str(tmp / f"cache-{i}"))
                full_s.append(time.perf_counter() - t)
                if first.unchanged:
                    raise SystemExit("the first build of a fresh destination said unchanged")
            empty_s: list[float] = []
            empty = flow(name="empty", log_prints=False)(lambda: None)
            for _ in range(args.repeat):
                t = time.perf_counter()
                empty()
                empty_s.append(time.perf_counter() - t)
            cfg = BuildConfig(source=str(root), destination=dest, versioned=True)
            for _ in range(args.repeat):
                t = time.perf_counter()
                again = build_dataset(cfg, cache_dir=str(tmp / "cache-noop"))
                noop_s.append(time.perf_counter() - t)
                if not again.unchanged or again.version != first.version:
                    raise SystemExit(f"the no-op run rebuilt: {again.version} != {first.version}")
        f, n, e = best(full_s), best(noop_s), best(empty_s)
        net = max(0.0, n - e) / f
        rows = [
            ["full versioned build", f"{f:.2f}", "1.00x", "—"],
            ["no-op (source unchanged)", f"{n:.3f}", f"{n / f:.4f}x", "—"],
            ["an empty Prefect flow run", f"{e:.3f}", f"{e / f:.4f}x", "—"],
            [
                "no-op, net of the empty flow run",
                f"{n - e:.3f}",
                f"**{net:.4f}x**",
                verdict(net, TARGET, at_most=True),
            ],
            ["Prefect test server start-up (apart)", f"{startup:.1f}", "—", "—"],
            ["importing Prefect and the flow (apart)", f"{imports:.1f}", "—", "—"],
        ]
        report.add(f"Source: {what}; {first.num_samples:,} samples, version {first.version}.")
        report.add(table(["run", "best s", "/ full", "target"], rows))
        report.write(not args.no_record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
