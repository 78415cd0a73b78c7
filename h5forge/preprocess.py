"""Run :func:`h5forge.images.process_file` over many inputs in worker processes.

Results come back strictly in input order, and at most ``window`` inputs are submitted but not
yet handed to the consumer, so memory stays bounded whatever the number of inputs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext

from h5forge.images import ImageConfig, Processed, Quarantined, process_file

__all__ = ["iter_processed"]

Result = Processed | Quarantined

_MAX_CHUNK = 4  # inputs per task: amortises IPC, keeps each message a few MB at most
_POOL_FROM = 8  # below this many inputs, starting processes costs more than it saves


def iter_processed(paths: Sequence[str | os.PathLike[str]], cfg: ImageConfig, *,
                   workers: int | None = None,
                   window: int | None = None) -> Generator[Result, None, None]:
    """Process every path and yield the results in input order.

    Stop early by closing the generator (``close()``, ``contextlib.closing``, or leaving a
    ``for`` loop and dropping it): pending work is cancelled and the worker processes exit.
    Workers start with forkserver or spawn (see ``_context``), so a script that calls this at
    import time needs the usual ``if __name__ == "__main__":`` guard.

    Args:
        paths: local paths; result ``i`` has ``index == i``.
        cfg: the image configuration.
        workers: worker processes, >= 1; default: the CPUs this process may use. With 1 (or
            fewer than 8 inputs) everything runs in this process.
        window: most inputs in flight (submitted, not yet yielded), >= 1; default
            ``4 * workers * chunk`` where chunk (inputs per task) is at most 4.

    Returns:
        A generator of :class:`Processed` or :class:`Quarantined`, one per path.

    Raises:
        ValueError: ``workers`` or ``window`` below 1, or an invalid ``cfg``.
        concurrent.futures.process.BrokenProcessPool: a worker died (decoder crash, OOM kill);
            the message names the inputs it held.
    """
    for name, value in (("workers", workers), ("window", window)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name}={value!r} must be an int >= 1 (or None for the default)")
    cfg.validate()
    items = [os.fspath(p) for p in paths]
    n_workers = workers or _usable_cpus()
    if n_workers == 1 or len(items) < _POOL_FROM:
        return (process_file(i, p, cfg) for i, p in enumerate(items))
    chunk = max(1, min(_MAX_CHUNK, len(items) // (n_workers * 4)))
    limit = window or 4 * n_workers * chunk
    return _pooled(items, cfg, n_workers, min(chunk, limit), limit)


def _process_chunk(start: int, paths: list[str], cfg: ImageConfig) -> list[Result]:
    # Module level so that spawn/forkserver workers can unpickle it by name.
    return [process_file(start + i, p, cfg) for i, p in enumerate(paths)]


def _pooled(paths: list[str], cfg: ImageConfig, workers: int, chunk: int,
            window: int) -> Generator[Result, None, None]:
    n = len(paths)
    pool = ProcessPoolExecutor(max_workers=min(workers, -(-n // chunk)),
                               mp_context=_context())
    pending: deque[tuple[int, int, Future[list[Result]]]] = deque()
    in_flight = 0  # submitted and not yet yielded
    next_start = 0
    try:
        while pending or next_start < n:
            while next_start < n and in_flight + min(chunk, n - next_start) <= window:
                stop = min(n, next_start + chunk)
                task = pool.submit(_process_chunk, next_start, paths[next_start:stop], cfg)
                pending.append((next_start, stop, task))
                in_flight += stop - next_start
                next_start = stop
            start, stop, task = pending.popleft()
            try:
                results = task.result()
            except BrokenProcessPool as e:
                raise BrokenProcessPool(
                    f"a worker process died while processing inputs {start}..{stop - 1} (first: "
                    f"{paths[start]!r}): a crashing decoder or the out-of-memory killer; rerun "
                    "with workers=1 to see which file") from e
            for r in results:
                in_flight -= 1
                yield r
    finally:
        for _, _, task in pending:
            task.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def _context() -> BaseContext:
    # fork() copies a parent that may run threads (Prefect's event loop, torch's thread pools,
    # h5py) and can deadlock in the child; Python 3.14 moved Linux to forkserver for this reason.
    # An explicitly chosen start method wins; otherwise keep the platform default (spawn on
    # macOS/Windows) unless it is fork, and use forkserver (spawn where it is missing) instead.
    chosen = multiprocessing.get_start_method(allow_none=True)
    if chosen is not None:
        return multiprocessing.get_context(chosen)
    available = multiprocessing.get_all_start_methods()  # the platform default comes first
    if available[0] != "fork":
        return multiprocessing.get_context(available[0])
    return multiprocessing.get_context("forkserver" if "forkserver" in available else "spawn")


def _usable_cpus() -> int:
    if hasattr(os, "process_cpu_count"):  # Python 3.13+
        return int(os.process_cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
