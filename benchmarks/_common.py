"""Shared pieces of the benchmark scripts: machine facts, timing, tables, RESULTS.md, servers.

Every benchmark measures h5forge and its baselines in the same process run (interleaved, best of
``--repeat``) and reports ratios, because the machine is shared and absolute rates drift.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


# --------------------------------------------------------------------------- arguments


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--images",
        type=Path,
        default=None,
        help="a real image folder (ImageFolder layout, or a flat folder of images) "
        "instead of the generated photo set",
    )
    p.add_argument(
        "--count",
        type=int,
        default=2000,
        help="images in the generated photo set (ignored with --images)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated photo set")
    p.add_argument("--repeat", type=int, default=3, help="runs per variant; the best is kept")
    p.add_argument(
        "--no-record",
        action="store_true",
        help="print only; do not append to benchmarks/RESULTS.md",
    )
    return p


def image_root(args: argparse.Namespace) -> tuple[Path, str]:
    """The image folder to benchmark and a one-line description of it."""
    from benchmarks.photoset import describe, ensure_photoset

    if args.images is not None:
        root = args.images.resolve()
        if not root.is_dir():
            raise SystemExit(f"--images {root} is not a folder")
        return root, describe(root, generated=False)
    root = ensure_photoset(count=args.count, seed=args.seed)
    return root, describe(root, generated=True)


# --------------------------------------------------------------------------- timing


def best(times: Sequence[float]) -> float:
    """The shortest of several wall times (the least disturbed by other load)."""
    return min(times)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``fn`` once; return ``(seconds, result)``."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def interleave(
    variants: dict[str, Callable[[], Any]],
    repeat: int,
    before: Callable[[str], None] | None = None,
) -> dict[str, list[float]]:
    """Run every variant ``repeat`` times, round-robin, so drift in load hits all alike;
    ``before(name)``, untimed, ahead of each run."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            if before is not None:
                before(name)
            seconds, _ = timed(fn)
            times[name].append(seconds)
            print(f"  {name}: {seconds:.3f} s", flush=True)
    return times


def epoch_rounds(
    feeds: dict[str, Any], epoch: Callable[[Any], int], repeat: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Time ``epoch(feed)`` (it returns the images it read) for every feed, ``repeat`` rounds,
    the order rotated by one each round so drift in load hits all alike and every feed takes
    every place. (Reversing the order every other round, as this did before, ran the first
    and the last feed twice in a row at each round's end: a 3-feed A/B of one loader against
    itself read 1.08x when last and 0.84x when in the middle.)

    Returns:
        The best images/s of each feed, and its median CPU seconds per image (this process
        and its children, from /proc: the DataLoader's workers).
    """
    rates: dict[str, list[float]] = {name: [] for name in feeds}
    cpu: dict[str, list[float]] = {name: [] for name in feeds}
    names = list(feeds)
    for r in range(repeat):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            c0, t0 = tree_cpu(), time.perf_counter()
            n = epoch(feeds[name])
            rates[name].append(n / (time.perf_counter() - t0))
            cpu[name].append((tree_cpu() - c0) / n)
            print(
                f"  {name}: {rates[name][-1]:,.0f} img/s, {cpu[name][-1] * 1e3:.3f} CPU ms/img",
                flush=True,
            )
    return rates, {name: statistics.median(c) for name, c in cpu.items()}


# --------------------------------------------------------------------------- reporting


def machine_facts() -> dict[str, str]:
    """What the figures depend on: CPU, cores, memory, library versions, date."""
    import h5py
    import numpy
    import PIL

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "absent"
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "nproc": str(os.cpu_count()),
        "usable cpus": str(len(os.sched_getaffinity(0))),
        "ram": mem,
        "python": platform.python_version(),
        "torch": torch_version,
        "h5py": h5py.version.version,
        "HDF5": h5py.version.hdf5_version,
        "numpy": numpy.__version__,
        "Pillow": PIL.__version__,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ratio: float, target: float, *, at_most: bool = False) -> str:
    ok = ratio <= target if at_most else ratio >= target
    return ("PASS" if ok else "MISS") + f" ({'<=' if at_most else '>='} {target:g})"


@dataclass
class Report:
    """One benchmark's section of RESULTS.md."""

    title: str
    facts: dict[str, str]
    parts: list[str]

    def add(self, text: str) -> None:
        self.parts.append(text)
        print(text, flush=True)

    def write(self, record: bool) -> None:
        if not record:
            return
        command = (
            "python -m benchmarks."
            + Path(sys.argv[0]).stem
            + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
        )
        facts = "; ".join(f"{k} {v}" for k, v in self.facts.items())
        body = "\n\n".join([f"## {self.title}", f"`{command}`", f"Machine: {facts}.", *self.parts])
        with open(RESULTS, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another benchmark may append at the same moment
            if f.tell() == 0:
                f.write(
                    "# Benchmark results\n\nAppended by the scripts in `benchmarks/`; newest "
                    "last. Ratios are measured in one run; absolute rates drift with load.\n"
                )
            f.write("\n" + body.rstrip() + "\n")
        print(f"\nappended to {RESULTS}")


def start_report(title: str) -> Report:
    facts = machine_facts()
    print(f"# {title}\n" + "; ".join(f"{k} {v}" for k, v in facts.items()), flush=True)
    return Report(title, facts, [])


# --------------------------------------------------------------------------- memory


def _tree_sum(root_pid: int, value: Callable[[str, list[str]], float]) -> float:
    """Sum of ``value(pid, stat fields after the command name)`` over ``root_pid`` and all its
    descendants, from /proc."""
    children: dict[int, list[int]] = {}
    values: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            values[int(entry)] = value(entry, fields)
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        total += values.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def tree_rss(root_pid: int) -> int:
    """Resident bytes of ``root_pid`` and all its descendants, from /proc."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss(pid: str, _: list[str]) -> float:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * page

    return int(_tree_sum(root_pid, rss))


def tree_cpu(root_pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process tree, including its reaped children.

    Pool workers started by a forkserver are the forkserver's children: when they exit, their
    time moves into the forkserver's ``cutime``/``cstime``, so the sum over the live tree before
    and after a run counts them as long as the forkserver lives (it lives as long as we do).
    """
    tick = os.sysconf("SC_CLK_TCK")
    return _tree_sum(
        root_pid or os.getpid(),  # utime stime cutime cstime
        lambda _, fields: sum(int(x) for x in fields[11:15]) / tick,
    )


@contextlib.contextmanager
def peak_tree_rss(pid: int | None = None, interval: float = 0.02) -> Iterator[list[int]]:
    """Sample the RSS of a process tree until the block exits; ``out[0]`` is the peak."""
    pid = pid or os.getpid()
    out = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out[0] = max(out[0], tree_rss(pid))
            stop.wait(interval)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out[0] = max(out[0], tree_rss(pid))


# --------------------------------------------------------------------------- S3 on loopback


class RequestLog:
    """Requests seen by the loopback S3 server: ``(method, path, range)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, str, str | None]] = []

    def clear(self) -> None:
        with self.lock:
            self.items.clear()

    def snapshot(self) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return list(self.items)


@dataclass
class LoopbackS3:
    endpoint_url: str
    log: RequestLog
    latency: float

    def storage_options(self) -> dict[str, Any]:
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }


def _serve_ranges_without_copying_objects() -> None:
    """Make moto answer a ranged GET in time proportional to the range, as S3 does.

    moto 5 reads the whole object out of its spooled buffer (a temp file past 8 MiB) for every
    GET and slices the range afterwards: a 4 KiB range of a 300 MB object costs it ~0.3 s of
    CPU under a per-object lock, which would make the loopback server, not the client, the
    thing measured. Patched here (benchmark process only): the object's bytes are read once
    and kept until the object is written again.
    """
    from moto.s3.models import FakeKey

    original = FakeKey.value
    if getattr(original.fget, "_h5forge_cached", False):
        return

    def get(self: Any) -> bytes:
        cached = self.__dict__.get("_h5forge_bytes")
        if cached is None:
            cached = self.__dict__["_h5forge_bytes"] = original.fget(self)
        return cached

    def set_(self: Any, new_value: bytes) -> None:
        self.__dict__.pop("_h5forge_bytes", None)
        original.fset(self, new_value)

    patched = property(get, set_)
    patched.fget._h5forge_cached = True  # type: ignore[attr-defined]
    FakeKey.value = patched  # type: ignore[method-assign, assignment]


@contextlib.contextmanager
def loopback_s3(latency_ms: float = 0.0, bandwidth_mbps: float = 0.0) -> Iterator[LoopbackS3]:
    """moto's S3 server on 127.0.0.1 with a request log, ``latency_ms`` added per request and,
    with ``bandwidth_mbps``, each answer's bytes taking that long at that rate.

    The latency models a real link (the request waits before moto answers); the bandwidth is per
    connection, as S3 serves one GET at ~100 MB/s while many run side by side. Requests are
    served on their own threads, so concurrent requests overlap their waits as on a network.
    """
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        os.environ[name] = value  # inherited by DataLoader workers; never the real ~/.aws
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    log = RequestLog()
    delay = latency_ms / 1000.0
    per_byte = 8.0 / (bandwidth_mbps * 1e6) if bandwidth_mbps > 0 else 0.0
    _serve_ranges_without_copying_objects()

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)

            def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
                with log.lock:
                    log.items.append(
                        (
                            environ["REQUEST_METHOD"],
                            environ.get("PATH_INFO", ""),
                            environ.get("HTTP_RANGE"),
                        )
                    )
                if delay:
                    time.sleep(delay)
                if not per_byte:
                    return app(environ, start_response)
                body = b"".join(app(environ, start_response))
                time.sleep(len(body) * per_byte)
                return [body]

            self._server = make_server(
                self._ip_address, self._port, recording, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    server = Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield LoopbackS3(f"http://{host}:{port}", log, delay)
    finally:
        server.stop()
