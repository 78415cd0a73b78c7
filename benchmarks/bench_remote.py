"""Remote reads from an S3 server on loopback (moto), requests counted at the server.

The server adds ``--latency-ms`` (default 20) before answering each request, to model a real
link; requests are served concurrently, so concurrent requests overlap their waits.

* **open**: requests and time for ``H5ImageDataset("s3://...")`` to open and load its index.
* **h5forge**: a DataLoader (2 workers, batch 64, random batches) over ``H5ImageDataset``: one
  ranged GET per sample, issued concurrently per batch (``cat_ranges``). With s3fs's default
  connection pool (10 per worker) and with ``config_kwargs={"max_pool_connections": 64}``.
* **h5py over a default fsspec file**: the common recipe, ``h5py.File(fs.open(url))`` with
  fsspec's default cache, one ``images[i]`` per item, same DataLoader; fewer batches (it is
  slow), its rate measured the same way.

    python -m benchmarks.bench_remote       # targets: <= 1.05 requests per sample, open <= 3
                                            # requests, >= 10 x h5py over fsspec
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from benchmarks._common import (
    RequestLog,
    image_root,
    loopback_s3,
    parser,
    start_report,
    table,
    verdict,
)
from benchmarks._datasets import H5pyOverFsspec


def _requested_bytes(items: list[tuple[str, str, str | None]]) -> int:
    total = 0
    for _method, _path, rng in items:
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            if first and last:
                total += int(last) - int(first) + 1
    return total


def _epoch(ds: Any, batches: int, batch_size: int, workers: int) -> int:
    sampler = RandomSampler(
        ds, num_samples=batches * batch_size, generator=torch.Generator().manual_seed(1)
    )
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers)
    n = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8
        n += len(labels)
    return n


def _measure(name: str, ds: Any, batches: int, args: Any, log: RequestLog) -> dict[str, Any]:
    log.clear()
    t0 = time.perf_counter()
    n = _epoch(ds, batches, args.batch_size, args.workers)
    seconds = time.perf_counter() - t0
    seen = log.snapshot()
    opens = [r for r in seen if r[0] == "HEAD" or (r[2] or "").startswith("bytes=0-")]
    reads = [r for r in seen if r not in opens]
    print(f"  {name}: {n / seconds:,.0f} img/s, {len(seen)} requests", flush=True)
    return {
        "name": name,
        "samples": n,
        "seconds": seconds,
        "requests": len(seen),
        "reads": len(reads),
        "bytes": _requested_bytes(seen),
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=16, help="batches per h5forge round")
    p.add_argument(
        "--baseline-batches",
        type=int,
        default=1,
        help="batches the h5py-over-fsspec baseline reads (it is slow)",
    )
    args = p.parse_args()
    import s3fs

    from h5forge import H5ImageDataset
    from h5forge.pack.writer import pack

    report = start_report("remote: S3 on loopback, h5forge vs h5py over a default fsspec file")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-remote-"))
    try:
        local = pack(root, tmp / "decoded.h5")
        with loopback_s3(args.latency_ms) as s3:
            opts = s3.storage_options()
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
            fs.mkdir("bench")
            fs.put_file(local.path, "bench/decoded.h5")
            url = "s3://bench/decoded.h5"
            tuned = {**opts, "config_kwargs": {"max_pool_connections": 64}}

            opens = []
            for _ in range(args.repeat):
                s3fs.S3FileSystem.clear_instance_cache()
                s3.log.clear()
                t0 = time.perf_counter()
                ds = H5ImageDataset(url, storage_options=opts)
                opens.append((time.perf_counter() - t0, s3.log.snapshot()))
            open_s, open_reqs = min(opens, key=lambda o: o[0])
            rows: list[dict[str, Any]] = []
            baseline = None
            for r in range(args.repeat):
                rows.append(_measure("h5forge, s3fs default pool", ds, args.batches, args, s3.log))
                rows.append(
                    _measure(
                        "h5forge, max_pool_connections=64",
                        H5ImageDataset(url, storage_options=tuned),
                        args.batches,
                        args,
                        s3.log,
                    )
                )
                if r == 0:
                    baseline = _measure(
                        "h5py over fsspec default file",
                        H5pyOverFsspec(url, opts, local.num_samples),
                        args.baseline_batches,
                        args,
                        s3.log,
                    )
        assert baseline is not None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def best(name: str) -> dict[str, Any]:
        return max(
            (x for x in rows if x["name"] == name), key=lambda x: x["samples"] / x["seconds"]
        )

    ours, fast = best("h5forge, s3fs default pool"), best("h5forge, max_pool_connections=64")
    workers_open = args.workers * len(open_reqs)
    per_sample = ours["reads"] / ours["samples"]
    rate = ours["samples"] / ours["seconds"]
    base_rate = baseline["samples"] / baseline["seconds"]
    sample_bytes = local.bytes / local.num_samples
    report.add(
        f"Input: {what}; packed decoded 224 ({local.num_samples} samples, "
        f"{local.bytes / 1e6:.0f} MB) uploaded to moto's S3 server on 127.0.0.1 with "
        f"**{args.latency_ms:g} ms added per request**. DataLoader: {args.workers} "
        f"workers, batch {args.batch_size}, random batches ({args.batches} per h5forge "
        f"round, best of {args.repeat}; {args.baseline_batches} for the baseline)."
    )
    listed = ", ".join(f"{m} {r}" if r else m for m, _, r in open_reqs)
    report.add(
        f"Open (`H5ImageDataset(url)`, index loaded): **{len(open_reqs)} requests** "
        f"({listed}), "
        f"{open_s * 1e3:.0f} ms; {verdict(len(open_reqs), 3, at_most=True)}."
    )
    report.add(
        table(
            [
                "reader",
                "images/s",
                "requests",
                "range reads / sample",
                "bytes requested / sample bytes",
                "vs h5py+fsspec",
            ],
            [
                [
                    x["name"],
                    f"{x['samples'] / x['seconds']:,.0f}",
                    x["requests"],
                    f"{x['reads'] / x['samples']:.3f}",
                    f"{x['bytes'] / x['samples'] / sample_bytes:.2f}",
                    f"{(x['samples'] / x['seconds']) / base_rate:.0f}x",
                ]
                for x in (ours, fast, baseline)
            ],
        )
    )
    report.add(
        "\n".join(
            [
                f"- range requests per sample (batched reads, excluding the {workers_open} "
                "requests of "
                f"the workers' opens) = **{per_sample:.3f}**, "
                f"{verdict(per_sample, 1.05, at_most=True)}",
                f"- open = **{len(open_reqs)} requests**, "
                f"{verdict(len(open_reqs), 3, at_most=True)}",
                f"- h5forge / h5py over fsspec = **{rate / base_rate:.0f}x**, "
                f"{verdict(rate / base_rate, 10)}",
            ]
        )
    )
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
