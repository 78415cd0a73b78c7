"""Remote reads from an S3 server on loopback (moto): h5forge's defaults against Mosaic, LitData.

The server adds ``--latency-ms`` (default 20) before answering each request and sends each
answer at ``--bandwidth-mbps`` (default 800, i.e. 100 MB/s per connection, about what one S3
GET gets), so a request costs 20 ms plus its bytes; concurrent requests overlap. Every reader
gets the same pixels (the images packed decoded at 224; the peers' own formats written by their
own writers from that file) and reads them with ``--workers`` workers (2), batch
``--batch-size`` (64), shuffled, persistent workers, two epochs of the same loader:

* **h5forge file / sharded, default**: two assets on the same server, the packed file published
  as a version (:func:`h5forge.publish.release.publish_version`: ``s3://bench/file``, its
  pointer, its ``v/<key>/file.h5`` and sidecar) and a sharded version published there by
  :func:`h5forge.publish.shard_release.build_sharded_version` (``h5forge build --versioned``'s
  path; default 64 MiB shards; ``s3://bench/photos``), each read by its base (its latest
  version) with the README's option-free call and nothing else:
  ``ds = H5ImageDataset(url, storage_options=opts)``,
  ``loader = ds.loader(64, shuffle=True, num_workers=2, persistent_workers=True)``, in a new
  process whose ``XDG_CACHE_HOME`` is an empty folder (a new machine's user cache);
* **second job**: then a new process with the same ``XDG_CACHE_HOME`` (a second training job on
  the same machine) opens the same asset the same way; its first epoch; **second job, version
  pinned**: the same, with ``version=`` the full sha256 the first job read (``ds.version``), as
  a job that pins what it trains on;
* **local file / sharded**: the same call on the local copy of each asset (a new process; the
  page cache warm), the second job's target;
* **Mosaic / LitData**: their ``StreamingDataset`` with its defaults over their shards (64 MiB)
  on the same server, an empty local cache, in a ``DataLoader`` (LitData's own
  ``StreamingDataLoader``, the loader its documentation uses and its epochs need) with the same
  workers, batch and persistent workers.

Each job runs in a child process of its own (:mod:`benchmarks._child`), so no reader shares a
process, or its forked workers' memory, with the S3 server or another reader. A first epoch's
time includes opening the dataset and making the loader (the imports are done before). Every
row is the median of ``--repeat`` interleaved rounds (the order of the readers rotated each
round). Per job the server's request log gives the requests and bytes asked for, and the
workers' peak RSS (``VmHWM``, read from /proc while the persistent workers live) the memory,
and the bytes left on disk in its ``XDG_CACHE_HOME`` (and a peer's own cache folder) the cache.

    python -m benchmarks.bench_remote --count 2000 --repeat 3
    # targets (issue 30): h5forge default / better peer >= 1.5x in epoch 1 and in epoch 2, for
    # the file and the sharded version; second job's epoch 1 >= 0.9x a local read's; a worker's
    # peak RSS <= 1.2x a local read's worker + the configured prefetch
    python -m benchmarks.bench_remote --count 400 --repeat 1 --peers '' --no-record  # quick
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import traceback
from pathlib import Path
from typing import Any

from benchmarks import _peers
from benchmarks._child import Child
from benchmarks._common import image_root, loopback_s3, parser, start_report, table, verdict

REPO = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- in the job's process

_JOB: dict[str, Any] = {}


def job_warm(kind: str) -> None:
    """The imports a reader needs, done before anything is timed."""
    import torch.utils.data  # noqa: F401

    if kind == "h5forge":
        import s3fs  # noqa: F401

        import h5forge.read.dataset  # noqa: F401
    elif kind == "mosaic":
        _peers.import_streaming()
        import boto3  # noqa: F401
    elif kind == "litdata":
        import litdata  # noqa: F401
        import obstore  # noqa: F401


def job_open(
    kind: str,
    url: str,
    storage_options: dict[str, Any] | None,
    batch_size: int,
    workers: int,
    shape: list[int] | None = None,
    cache: str | None = None,
    version: str | None = None,
) -> None:
    """The reader's dataset and loader, as its documentation shows them, kept for the epochs."""
    if kind == "h5forge":
        from h5forge import H5ImageDataset

        pinned = {} if version is None else {"version": version}
        if storage_options is None:
            ds = H5ImageDataset(url, **pinned)
        else:
            ds = H5ImageDataset(url, storage_options=storage_options, **pinned)
        loader = ds.loader(batch_size, shuffle=True, num_workers=workers, persistent_workers=True)
    elif kind == "mosaic":
        from torch.utils.data import DataLoader

        assert shape is not None
        assert cache is not None
        ds = _peers.mosaic_dataset(url, Path(cache), tuple(shape), batch_size)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=True)
    elif kind == "litdata":
        from litdata import StreamingDataLoader

        assert storage_options is not None
        assert cache is not None
        ds = _peers.litdata_dataset(url, Path(cache), storage_options)
        loader = StreamingDataLoader(
            ds, batch_size=batch_size, num_workers=workers, persistent_workers=True
        )
    else:
        raise ValueError(f"no reader {kind!r}")
    _JOB["loader"] = loader


def job_epoch() -> int:
    """One epoch of the job's loader; the images it yielded."""
    return sum(len(labels) for _, labels in _JOB["loader"])


def _vm_hwm(pid: int) -> int:
    """Peak resident bytes of ``pid`` (``VmHWM``); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def job_worker_peaks() -> list[int]:
    """Each live DataLoader worker's peak RSS (bytes): the persistent workers of the job's
    loader (torch's ``_iterator._workers``; failing that, this process's children)."""
    workers = getattr(getattr(_JOB["loader"], "_iterator", None), "_workers", None)
    pids = [w.pid for w in workers] if workers else _children(os.getpid())
    return [_vm_hwm(pid) for pid in pids]


def job_close() -> None:
    """Drop the loader (its persistent workers end)."""
    _JOB.clear()


# --------------------------------------------------------------------------- in the bench


def _bytes(log: list[tuple[str, str, str | None]], sizes: dict[str, int]) -> int:
    """Bytes the GETs asked for that the objects hold: a range past an object's end counts to
    its end (a bounded read of a small document asks for up to its bound, 256 MiB for a
    version's manifest, and gets the document)."""
    total = 0
    for method, path, rng in log:
        if method != "GET":
            continue
        size = sizes.get(path, 0)
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            if not first:  # a suffix range: the last N bytes
                total += min(int(last), size)
                continue
            end = min(int(last) + 1, size) if last else size
            total += max(0, end - int(first))
        else:
            total += size
    return total


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=800.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--peers", default="mosaic,litdata", help="comma-separated; '' for none")
    args = p.parse_args()
    import s3fs

    from h5forge import H5ImageDataset
    from h5forge.location import Location
    from h5forge.pack.writer import pack
    from h5forge.publish.release import publish_version
    from h5forge.publish.shard_release import build_sharded_version

    report = start_report("remote: S3 on loopback, h5forge's defaults vs Mosaic, LitData")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-remote-"))
    peers = [x for x in args.peers.split(",") if x]
    # name -> per-round figures: img/s, requests, bytes; the worker peak; the bytes in the job's
    # XDG_CACHE_HOME and (a peer's) local cache folder after it.
    rates: dict[str, list[float]] = {}
    alone: dict[str, list[float]] = {}  # epoch rates without the open
    opens: dict[str, list[float]] = {}  # seconds the dataset and loader took to make
    reqs: dict[str, list[float]] = {}
    asked: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    cached: dict[str, list[float]] = {}
    notes: list[str] = []
    pythonpath = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
    try:
        print("packing ...", flush=True)
        local = pack(root, tmp / "decoded.h5")
        n = len(H5ImageDataset(local.path))
        shape = list(H5ImageDataset(local.path)[0][0].permute(1, 2, 0).shape)
        local_base = tmp / "local" / "photos"
        built = build_sharded_version(root, Location(str(local_base)))
        if built is None or built.num_samples != n:
            raise SystemExit(f"the local sharded version holds {built} samples, not {n}")
        if "mosaic" in peers:
            _peers.write_mds(local.path, tmp / "mds")
        if "litdata" in peers:
            _peers.write_litdata(local.path, tmp / "litdata")
        with loopback_s3(args.latency_ms, args.bandwidth_mbps) as s3:
            opts = s3.storage_options()
            os.environ["S3_ENDPOINT_URL"] = s3.endpoint_url  # Mosaic's endpoint setting
            # LitData's chunk GETs go through obstore (Rust object_store), which refuses a plain
            # http:// endpoint ("HTTP error: builder error") unless told to allow it.
            os.environ["AWS_ALLOW_HTTP"] = "true"
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
            fs.mkdir("bench")
            published = publish_version(local.path, Location("s3://bench/file", opts))
            print("publishing the sharded version to S3 ...", flush=True)
            remote = build_sharded_version(root, Location("s3://bench/photos", opts))
            if remote is None or remote.num_samples != n:
                raise SystemExit(f"the sharded version on S3 is {remote}, not {n} samples")
            for peer in peers:
                fs.put(
                    str(tmp / ("mds" if peer == "mosaic" else "litdata")),
                    f"bench/{peer}",
                    recursive=True,
                )
            sizes = {
                "/" + f["name"]: int(f["size"]) for f in fs.find("bench", detail=True).values()
            }

            def job(
                name: str,
                kind: str,
                url: str,
                xdg: Path,
                epochs: int,
                *,
                storage: dict[str, Any] | None = None,
                cache: Path | None = None,
                version: str | None = None,
            ) -> None:
                """One job in a new process: open, ``epochs`` epochs, workers' peaks."""
                xdg.mkdir(parents=True, exist_ok=True)
                child = Child(REPO, env={"PYTHONPATH": pythonpath, "XDG_CACHE_HOME": str(xdg)})
                try:
                    child.run("benchmarks.bench_remote:job_warm", kind=kind)
                    s3.log.clear()
                    opened, _ = child.run(
                        "benchmarks.bench_remote:job_open",
                        kind=kind,
                        url=url,
                        storage_options=storage,
                        batch_size=args.batch_size,
                        workers=args.workers,
                        shape=shape,
                        cache=str(cache) if cache else None,
                        version=version,
                    )
                    opens.setdefault(name, []).append(opened)
                    for e in range(1, epochs + 1):
                        seconds, got = child.run("benchmarks.bench_remote:job_epoch")
                        alone.setdefault(f"{name}, epoch {e}", []).append(got / seconds)
                        seconds += opened if e == 1 else 0.0
                        seen = s3.log.snapshot()
                        s3.log.clear()
                        row = f"{name}, epoch {e}"
                        rates.setdefault(row, []).append(got / seconds)
                        reqs.setdefault(row, []).append(len(seen))
                        asked.setdefault(row, []).append(_bytes(seen, sizes))
                        print(
                            f"  {row}: {got} in {seconds:.2f} s, {got / seconds:,.0f} img/s, "
                            f"{len(seen)} requests",
                            flush=True,
                        )
                    _, worker_peaks = child.run("benchmarks.bench_remote:job_worker_peaks")
                    peaks.setdefault(name, []).append(max(worker_peaks, default=0))
                    cached.setdefault(name, []).append(
                        _tree_bytes(xdg) + (_tree_bytes(cache) if cache else 0)
                    )
                    child.run("benchmarks.bench_remote:job_close")
                finally:
                    child.close()

            assets = {
                "file": ("s3://bench/file", local.path, published.sha256),
                "sharded": ("s3://bench/photos", str(local_base), remote.sha256),
            }

            def h5forge_jobs(asset: str, r: int) -> None:
                url, _, sha = assets[asset]
                xdg = tmp / f"xdg-{asset}-{r}"
                job(f"h5forge {asset}, default", "h5forge", url, xdg, 2, storage=opts)
                job(f"h5forge {asset}, second job", "h5forge", url, xdg, 1, storage=opts)
                job(
                    f"h5forge {asset}, second job, version pinned",
                    "h5forge",
                    url,
                    xdg,
                    1,
                    storage=opts,
                    version=sha,
                )

            def local_job(asset: str, r: int) -> None:
                _, path, _ = assets[asset]
                job(f"local {asset}", "h5forge", path, tmp / f"xdg-local-{asset}-{r}", 2)

            def peer_job(peer: str, r: int) -> None:
                job(
                    peer,
                    peer,
                    f"s3://bench/{peer}",
                    tmp / f"xdg-{peer}-{r}",
                    2,
                    storage=opts,
                    cache=tmp / f"{peer}-cache-{r}",
                )

            units: list[tuple[str, Any, str]] = [
                ("h5forge file", h5forge_jobs, "file"),
                ("h5forge sharded", h5forge_jobs, "sharded"),
                ("local file", local_job, "file"),
                ("local sharded", local_job, "sharded"),
            ] + [(peer, peer_job, peer) for peer in peers]
            failed: set[str] = set()
            for r in range(args.repeat):
                k = r % len(units)
                for label, run, what_ in units[k:] + units[:k]:
                    if label in failed:
                        continue
                    try:
                        run(what_, r)
                    except Exception as e:  # a peer that cannot read from this server: say why
                        notes.append(f"{label}: {type(e).__name__}: {e}")
                        traceback.print_exc()
                        failed.add(label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def rate(name: str) -> float:
        return _med(rates.get(name, []))

    report.add(
        f"Input: {what}; packed decoded 224 ({n} samples, {local.bytes / 1e6:.0f} MB as one file; "
        f"{remote.shards} shards of the sharded version) on moto's S3 server on 127.0.0.1: "
        f"**{args.latency_ms:g} ms per request, {args.bandwidth_mbps:g} Mbit/s per "
        f"connection**. Every job a new process (a new, empty XDG_CACHE_HOME; the second job "
        f"the first's), {args.workers} workers, batch {args.batch_size}, shuffle, persistent "
        f"workers, two epochs of one loader; h5forge with no argument but the storage options. "
        f"Medians of {args.repeat} interleaved rounds; epoch 1 includes the open."
    )
    rows = []
    for name in rates:
        job_name = name.rsplit(", epoch", 1)[0]
        rows.append(
            [
                name,
                f"{rate(name):,.0f}",
                f"{_med(reqs[name]):,.0f}",
                f"{_med(asked[name]) / 1e6:,.0f}",
                f"{_med(peaks.get(job_name, [])) / 1e6:,.0f}" if name.endswith("1") else "",
                f"{_med(cached.get(job_name, [])) / 1e6:,.0f}" if name.endswith("1") else "",
            ]
        )
    report.add(
        table(
            [
                "reader, epoch",
                "images/s",
                "requests",
                "MB requested",
                "worker peak RSS, MB",
                "local cache after, MB",
            ],
            rows,
        )
    )
    lines = []
    for asset in ("file", "sharded"):
        ours = f"h5forge {asset}, default"
        for e in (1, 2):
            better = max((rate(f"{peer}, epoch {e}") for peer in peers), default=0.0)
            if better:
                x = rate(f"{ours}, epoch {e}") / better
                lines.append(
                    f"- h5forge {asset} default / better peer, epoch {e} = **{x:.2f}x**, "
                    f"{verdict(x, 1.5)}"
                )
        for job_name, how in (
            (f"h5forge {asset}, second job", "the S3 client made, the pointer read"),
            (f"h5forge {asset}, second job, version pinned", "no request"),
        ):
            second, loc = rate(f"{job_name}, epoch 1"), rate(f"local {asset}, epoch 1")
            if not (second and loc):
                continue
            lines.append(
                f"- {job_name} / local read, epoch 1 = **{second / loc:.2f}x**, "
                f"{verdict(second / loc, 0.9)}"
            )
            s2 = _med(alone.get(f"{job_name}, epoch 1", []))
            l2 = _med(alone.get(f"local {asset}, epoch 1", []))
            o2, lo = _med(opens.get(job_name, [])), _med(opens.get(f"local {asset}", []))
            if s2 and l2:
                lines.append(
                    f"  - the same without the dataset's open (the loader's first epoch alone, "
                    f"workers' start included): **{s2 / l2:.2f}x**, {verdict(s2 / l2, 0.9)}; "
                    f"the open: {o2 * 1000:.0f} ms remote ({how}), {lo * 1000:.0f} ms local"
                )
        mine, theirs = _med(peaks.get(ours, [])), _med(peaks.get(f"local {asset}", []))
        if mine and theirs:
            lines.append(
                f"- h5forge {asset} worker peak RSS: remote {mine / 1e6:,.0f} MB, local "
                f"{theirs / 1e6:,.0f} MB, ratio **{mine / theirs:.2f}x**; remote - 1.2 x local "
                f"= {(mine - 1.2 * theirs) / 1e6:,.0f} MB (target: <= the configured prefetch)"
            )
    lines += [f"- not measured: {x}" for x in notes]
    report.add("\n".join(lines))
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
