"""Remote reads from an S3 server on loopback (moto): h5forge against Mosaic and LitData.

The server adds ``--latency-ms`` (default 20) before answering each request and sends each
answer at ``--bandwidth-mbps`` (default 800, i.e. 100 MB/s per connection, about what one S3
GET gets), so a request costs 20 ms plus its bytes; concurrent requests overlap. Every reader
gets the same pixels (a decoded 224 h5forge file; the peers' own formats written by their own
writers from it), a DataLoader with ``--workers`` workers and batch ``--batch-size``, one epoch:

* **h5forge uniform / block**: ``ds.loader()`` over ``s3://`` with no cache, sampler a uniform
  or a block shuffle (:func:`h5forge.read.order.epoch_order`, ``--block-size``, ``--window``),
  the block shuffle again with s3fs's pool raised to ``--pool`` connections per process;
* **h5forge cold / warm cache**: ``cache_dir=`` empty (the download is timed) and filled;
* **h5forge local**: the same file on local disk (the warm cache's target);
* **Mosaic / LitData epoch 1 / 2**: their ``StreamingDataset`` over their shards on the same
  server, local cache empty then filled.

    python -m benchmarks.bench_remote     # targets: first epoch >= 1.5x the better peer's,
                                          # warm cache >= 0.9x local read
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from benchmarks import _peers
from benchmarks._common import image_root, loopback_s3, parser, start_report, table, verdict


def _bytes(log: list[tuple[str, str, str | None]], sizes: dict[str, int]) -> int:
    total = 0
    for method, path, rng in log:
        if method != "GET":
            continue
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            end = int(last) + 1 if last else sizes.get(path, 0)
            total += max(0, end - int(first))
        else:
            total += sizes.get(path, 0)
    return total


def _run(loader: Callable[[], Any]) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(len(labels) for _, labels in loader())
    return n, time.perf_counter() - t0


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=800.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--block-size", type=int, default=16, help="samples per shuffle block (x window = batch)"
    )
    p.add_argument("--window", type=int, default=4, help="blocks a batch draws from")
    p.add_argument("--pool", type=int, default=32, help="s3fs max_pool_connections, one case")
    p.add_argument("--peers", default="mosaic,litdata", help="comma-separated; '' for none")
    args = p.parse_args()
    import s3fs

    from h5forge import H5ImageDataset
    from h5forge.pack.writer import pack
    from h5forge.read.order import block_locality, epoch_order

    report = start_report("remote: S3 on loopback, h5forge (no cache, cache) vs Mosaic, LitData")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-remote-"))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        local = pack(root, tmp / "decoded.h5")
        ref = H5ImageDataset(local.path)
        n, shape = len(ref), tuple(ref[0][0].permute(1, 2, 0).shape)
        peers = [x for x in args.peers.split(",") if x]
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
            fs.put_file(local.path, "bench/decoded.h5")
            from h5forge.location import Location
            from h5forge.publish.sidecar import sidecar_bytes, sidecar_url

            sha = Location.of(local.path).sha256()
            fs.pipe(sidecar_url("bench/decoded.h5"), sidecar_bytes(sha, local.bytes, {}))
            for peer in peers:
                fs.put(
                    str(tmp / ("mds" if peer == "mosaic" else "litdata")),
                    f"bench/{peer}",
                    recursive=True,
                )
            sizes = {
                "/" + f["name"]: int(f["size"]) for f in fs.find("bench", detail=True).values()
            }
            url = "s3://bench/decoded.h5"
            uniform = epoch_order(n, seed=1).tolist()
            block = epoch_order(n, seed=1, block_size=args.block_size, window=args.window).tolist()
            kw = {"num_workers": args.workers}

            def ours(order: list[int], options: Any = opts, **ds_kw: Any) -> Callable[[], Any]:
                return lambda: H5ImageDataset(url, storage_options=options, **ds_kw).loader(
                    args.batch_size, sampler=order, **kw
                )

            # s3fs's pool is 10 connections per process; a batch's read-ahead blocks can use more.
            pooled = {**opts, "config_kwargs": {"max_pool_connections": args.pool}}

            def peer_loader(name: str, cache: Path) -> Callable[[], Any]:
                def make() -> Any:
                    if name == "mosaic":
                        ds = _peers.mosaic_dataset(
                            "s3://bench/mosaic", cache, shape, args.batch_size
                        )
                    else:  # LitData's own loader, as its documentation uses it
                        from litdata import StreamingDataLoader

                        ds = _peers.litdata_dataset("s3://bench/litdata", cache, opts)
                        return StreamingDataLoader(ds, batch_size=args.batch_size, **kw)
                    return DataLoader(ds, batch_size=args.batch_size, **kw)

                return make

            for r in range(args.repeat):
                cache = tmp / f"cache-{r}"
                cases: list[tuple[str, Callable[[], Any]]] = [
                    ("h5forge, uniform shuffle, no cache", ours(uniform)),
                    ("h5forge, block shuffle, no cache", ours(block)),
                    (f"h5forge, block shuffle, no cache, pool {args.pool}", ours(block, pooled)),
                    ("h5forge, cold cache (download timed)", ours(uniform, cache_dir=cache)),
                    ("h5forge, warm cache", ours(uniform, cache_dir=cache)),
                    (
                        "h5forge, local file",
                        lambda: H5ImageDataset(local.path).loader(
                            args.batch_size, sampler=uniform, **kw
                        ),
                    ),
                ]
                for peer in peers:
                    pc = tmp / f"{peer}-cache-{r}"
                    cases += [
                        (f"{peer}, epoch 1", peer_loader(peer, pc)),
                        (f"{peer}, epoch 2", peer_loader(peer, pc)),
                    ]
                for name, make in cases:
                    s3.log.clear()
                    try:
                        got, seconds = _run(make)
                    except Exception as e:  # a peer that cannot read from this server: say why
                        notes.append(f"{name}: {type(e).__name__}: {e}")
                        traceback.print_exc()
                        continue
                    seen = s3.log.snapshot()
                    rows.append(
                        {
                            "name": name,
                            "n": got,
                            "s": seconds,
                            "req": len(seen),
                            "bytes": _bytes(seen, sizes),
                        }
                    )
                    print(
                        f"  {name}: {got} in {seconds:.2f} s, {got / seconds:,.0f} img/s, "
                        f"{len(seen)} requests",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def rate(name: str) -> float:
        return max((x["n"] / x["s"] for x in rows if x["name"] == name), default=0.0)

    report.add(
        f"Input: {what}; packed decoded 224 ({n} samples, {local.bytes / 1e6:.0f} MB) on moto's "
        f"S3 server on 127.0.0.1: **{args.latency_ms:g} ms per request, "
        f"{args.bandwidth_mbps:g} Mbit/s per connection**. DataLoader: {args.workers} workers, "
        f"batch {args.batch_size}, one epoch per case, best of {args.repeat}. Block shuffle: "
        f"block {args.block_size}, window {args.window} "
        f"({block_locality(block, args.batch_size, args.block_size):.1f} blocks per batch; "
        f"uniform {block_locality(uniform, args.batch_size, args.block_size):.1f})."
    )
    names = list(dict.fromkeys(x["name"] for x in rows))
    best = {
        nm: max((x for x in rows if x["name"] == nm), key=lambda x: x["n"] / x["s"]) for nm in names
    }
    report.add(
        table(
            ["reader", "images/s", "requests", "MB requested", "bytes / sample bytes"],
            [
                [
                    nm,
                    f"{rate(nm):,.0f}",
                    x["req"],
                    f"{x['bytes'] / 1e6:,.0f}",
                    f"{x['bytes'] / local.bytes:.2f}",
                ]
                for nm, x in best.items()
            ],
        )
    )
    peer_first = max((rate(f"{p}, epoch 1") for p in ("mosaic", "litdata")), default=0.0)
    first = max(
        rate("h5forge, uniform shuffle, no cache"),
        rate("h5forge, block shuffle, no cache"),
        rate(f"h5forge, block shuffle, no cache, pool {args.pool}"),
    )
    lines = []
    if peer_first:
        lines.append(
            f"- h5forge first epoch / better peer's = **{first / peer_first:.2f}x**, "
            f"{verdict(first / peer_first, 1.5)}"
        )
        cold = rate("h5forge, cold cache (download timed)")
        lines.append(
            f"- h5forge cold cache / better peer's first epoch = **{cold / peer_first:.2f}x**"
        )
    warm, loc = rate("h5forge, warm cache"), rate("h5forge, local file")
    lines.append(f"- warm cache / local read = **{warm / loc:.2f}x**, {verdict(warm / loc, 0.9)}")
    lines += [f"- not measured: {x}" for x in notes]
    report.add("\n".join(lines))
    report.write(not args.no_record)


if __name__ == "__main__":
    main()
