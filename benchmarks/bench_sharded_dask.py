"""A sharded version built on Dask (no merge) against today's Dask build (parts + merge).

The same catalog on one ``distributed.LocalCluster`` of 2 single-thread worker processes,
interleaved, ``--repeat`` rounds (no Prefect: the library's steps the build flow runs):

- today's Dask build: :func:`h5forge.scale.parts.pack_part` per part on the workers (each
  part sealed, verified, published to a local staging folder with its sidecar, read back),
  then :func:`h5forge.scale.merge.merge_parts` in this process (timed apart: "merge");
- sharded on Dask: :func:`h5forge.publish.sharded.plan_sharded`, parts of whole shards
  (:func:`h5forge.scale.shard_parts.cut_shard_parts`) packed by
  :func:`h5forge.scale.shard_parts.pack_part_shards` on the workers (each shard sealed, verified,
  uploaded to a local store, read back), then :func:`~h5forge.publish.sharded.stage_sharded`
  and :func:`~h5forge.publish.sharded.publish_sharded` here (manifest and pointer: "publish").

The sharded path includes its publish; today's build is timed without publishing the merged
file (one more copy of every byte), so the comparison favours today's build. Shards are sized
so that a part holds the same images as today's parts (``--part-size``, 2 shards a part).

Target (issue 29): sharded wall <= today's Dask build minus today's merge. The CPU seconds of
the workers and this process together are shown too: on a shared 2-core machine they move
less with other load than wall time does.

    python -m benchmarks.bench_sharded_dask --repeat 5   # 2000 generated photos
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import image_root, interleave, median, parser, start_report, table, verdict
from h5forge.discover.catalog import Catalog, discover
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.publish.shard_release import publish_sharded
from h5forge.publish.sharded import plan_sharded, stage_sharded
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import pack_part
from h5forge.scale.plan import part_catalog, part_url, plan_parts
from h5forge.scale.shard_parts import cut_shard_parts, pack_part_shards, part_samples


def _process_cpu() -> float:
    """CPU seconds (user + system) of the calling process: run on each worker."""
    t = os.times()
    return t.user + t.system


def _cpu(client: Any) -> float:
    """CPU seconds of the workers and this process together (load-independent work)."""
    return sum(client.run(_process_cpu).values()) + _process_cpu()


def _today(client: Any, catalog: Catalog, part_size: int, work: Path, phases: dict) -> None:
    c0 = _cpu(client)
    staging = work / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    specs = plan_parts(catalog, samples_per_part=part_size)
    t = time.perf_counter()
    futures = client.map(
        pack_part,
        [part_catalog(catalog, s) for s in specs],
        specs,
        staging=str(staging),
        config=PackConfig(),
        pure=False,
    )
    client.gather(futures)
    phases["parts"].append(time.perf_counter() - t)
    t = time.perf_counter()
    merge_parts(
        [part_url(str(staging), s) for s in specs],
        work / "merged.h5",
        overwrite=True,
        max_bad_fraction=1.0,
    )
    phases["merge"].append(time.perf_counter() - t)
    phases["today cpu"].append(_cpu(client) - c0)


def _sharded(
    client: Any, catalog: Catalog, part_size: int, shard_size: int, work: Path, phases: dict
) -> None:
    c0 = _cpu(client)
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    asset = Location(str(store / "photos.h5"))
    config = PackConfig()
    t = time.perf_counter()
    plan = plan_sharded(catalog, config=config, max_shard_size=shard_size)
    parts = cut_shard_parts(plan, samples_per_part=part_size)
    futures = client.map(
        pack_part_shards,
        [part_samples(plan.fresh, p) for p in parts],
        parts,
        asset=asset,
        config=config,
        pure=False,
    )
    done = client.gather(futures)  # in plan order: client.map keeps its inputs' order
    phases["shard parts"].append(time.perf_counter() - t)
    t = time.perf_counter()
    staged = stage_sharded(
        catalog,
        plan,
        [e for r in done for e in r.entries],
        [q for r in done for q in r.quarantined],
        config=config,
        previous=None,
        max_bad_fraction=1.0,
        name="photos",
        in_store=frozenset(e.sha256 for r in done for e in r.entries),
    )
    publish_sharded(staged, asset, based_on="")
    phases["publish"].append(time.perf_counter() - t)
    phases["sharded cpu"].append(_cpu(client) - c0)
    phases["parts count"] = [len(parts)]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--part-size", type=int, default=250, help="images per part")
    args = p.parse_args()
    from distributed import Client, LocalCluster

    root, described = image_root(args)
    report = start_report("Sharded version on Dask (no merge) vs Dask build + merge")
    catalog = discover(root)
    sample = 224 * 224 * 3  # decoded 224 RGB: what plan_shards counts per sample
    shard_size = max(2**20, (args.part_size // 2) * sample + sample // 2)  # 2 shards a part
    phases: dict[str, list[float]] = {
        k: [] for k in ("parts", "merge", "shard parts", "publish", "today cpu", "sharded cpu")
    }
    t0 = time.perf_counter()
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    client.wait_for_workers(2)
    startup = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sharded-dask-") as tmp:
            work = Path(tmp)
            times = interleave(
                {
                    "dask parts + merge": lambda: _today(
                        client, catalog, args.part_size, work, phases
                    ),
                    "sharded dask (no merge)": lambda: _sharded(
                        client, catalog, args.part_size, shard_size, work, phases
                    ),
                },
                args.repeat,
            )
    finally:
        client.close()
        cluster.close()
    today, sharded = times["dask parts + merge"], times["sharded dask (no merge)"]
    n = len(catalog.samples)
    rows = [
        [
            "today: dask parts + merge",
            f"{median(today):.2f}",
            f"{min(today):.2f}",
            n / median(today),
            f"{median(phases['parts']):.2f}",
            f"{median(phases['merge']):.2f}",
            f"{median(phases['today cpu']):.2f}",
        ],
        [
            "sharded dask, no merge (publish included)",
            f"{median(sharded):.2f}",
            f"{min(sharded):.2f}",
            n / median(sharded),
            f"{median(phases['shard parts']):.2f}",
            f"{median(phases['publish']):.2f}",
            f"{median(phases['sharded cpu']):.2f}",
        ],
    ]
    report.add(
        f"Input: {described}. LocalCluster 2 workers x 1 thread (start-up {startup:.1f} s, not "
        f"counted); decoded 224; parts of {args.part_size} images (today: "
        f"{len(plan_parts(catalog, samples_per_part=args.part_size))} parts; sharded: "
        f"{phases['parts count'][0]} parts of 2 shards of max_shard_size {shard_size:,} bytes); "
        f"{args.repeat} rounds interleaved, medians (and best)."
    )
    report.add(
        table(
            [
                "build",
                "median s",
                "best s",
                "img/s",
                "parts s (median)",
                "merge / publish s (median)",
                "CPU s, workers + here (median)",
            ],
            rows,
        )
    )
    bound = median(today) - median(phases["merge"])
    report.add(
        f"Target: sharded wall <= today's build - today's merge = {median(today):.2f} - "
        f"{median(phases['merge']):.2f} = {bound:.2f} s; sharded {median(sharded):.2f} s: "
        f"{verdict(median(sharded) / bound, 1.0, at_most=True)} (ratio "
        f"{median(sharded) / bound:.2f})."
    )
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
