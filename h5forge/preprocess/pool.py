"""Run :func:`h5forge.preprocess.images.process_file` over many inputs in worker processes.

Results come back strictly in input order, and at most ``window`` inputs are submitted but not
yet handed to the consumer, so memory stays bounded whatever the number of inputs.

Decoded samples of a fixed size do not travel back through the pool's pipe: workers write them
into a shared-memory ring of ``window`` slots (:mod:`h5forge.preprocess.ring`) and return only
the digest. Slots cannot collide: input ``i`` uses slot ``i % window``, and it is submitted only
after input ``i - window`` was read out (and, when the consumer keeps borrowed results, the
``borrow - 1`` after it too).

Workers end with the process that owns the pool, even when it is killed with SIGKILL
(:mod:`h5forge.lifetime`).

Which start method the workers use, and what their fork server imports:
:mod:`h5forge.preprocess.workers`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing.context import BaseContext
from types import FrameType

from h5forge.cpus import usable_cpus
from h5forge.lifetime import end_with_owner
from h5forge.main_guard import check_entry_point, reimport_hint
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Processed, Quarantined, process_file
from h5forge.preprocess.ring import InRing, Ring
from h5forge.preprocess.workers import (
    POOL_FROM,
    check_main_importable,
    unchoose,
    worker_context,
)
from h5forge.targets.schema import Column

__all__ = ["iter_processed"]

Result = Processed | Quarantined

# Inputs per task: amortises the pool's IPC (4 -> 16 cut the writer's CPU per image by ~15%);
# fixed-size samples go through the ring, so a message stays small either way.
_MAX_CHUNK = 16
_RING_BYTES = 256 << 20  # the default window holds at most about this much in the ring


def iter_processed(
    paths: Sequence[str | os.PathLike[str]],
    cfg: ImageConfig,
    *,
    workers: int | None = None,
    window: int | None = None,
    borrow: int = 0,
    threads: bool = False,
    schema: Sequence[Column] = (),
    targets: Sequence[Sequence[object]] | None = None,
) -> Generator[Result, None, None]:
    """Process every path and yield the results in input order.

    Stop early by closing the generator (``close()``, ``contextlib.closing``, or leaving a
    ``for`` loop and dropping it): pending work is cancelled and the worker processes exit.
    Workers start with forkserver or spawn (see :func:`worker_context`), so a
    script that calls this at import time needs the usual ``if __name__ == "__main__":`` guard.

    Args:
        paths: local paths; result ``i`` has ``index == i``.
        cfg: the image configuration.
        workers: worker processes, >= 1; default: the CPUs this process may use. With 1 (or
            fewer than 8 inputs) everything runs in this process.
        window: most inputs in flight (submitted, not yet yielded), >= 1; default
            ``4 * workers * chunk`` where chunk (inputs per task) is at most 16, fewer when
            that many fixed-size samples would pass 256 MiB (never below
            ``2 * workers * chunk``), plus the ``borrow - 1`` slots the consumer keeps.
        borrow: a fixed-size sample's ``data`` may be a read-only memoryview of its slot in the
            shared-memory ring instead of a copy, valid until ``borrow`` more results were
            asked for (``True`` or 1: until the next one; the writer keeps a few to write them
            together, straight from the ring). 0 (the default): copies.
        threads: run ``workers`` threads of this process instead of worker processes (for a
            few inputs, where starting processes costs more than the GIL does; an incremental
            pack's new files). A decoder crash then takes this process with it.
        schema: the target columns (mask ``encoding`` set); ``()``: none.
        targets: with a schema, each path's raw target values (one per column), encoded in
            the worker next to the image (:func:`~h5forge.preprocess.images.process_file`).

    Returns:
        A generator of :class:`Processed` or :class:`Quarantined`, one per path.

    Raises:
        ValueError: ``workers`` or ``window`` below 1, an invalid ``cfg``, or ``targets`` not
            one row per path.
        concurrent.futures.process.BrokenProcessPool: a worker died (decoder crash, OOM kill);
            the message names the inputs it held.
    """
    if not isinstance(borrow, int) or borrow < 0:  # a bool is one
        raise ValueError(f"borrow={borrow!r} must be an int >= 0 (or a bool)")
    hold = max(int(borrow) - 1, 0)  # slots the consumer holds besides the latest result's
    for name, value in (("workers", workers), ("window", window)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}={value!r} must be an int >= 1 (or None for the default)")
    cfg.validate()
    items = [os.fspath(p) for p in paths]
    schema = tuple(schema)
    rows = [tuple(t) for t in targets] if schema and targets is not None else None
    if schema and (rows is None or len(rows) != len(items)):
        raise ValueError(f"targets must give one row per path ({len(items)}) with a schema")
    jobs = _Jobs(cfg, schema, rows)
    n_workers = workers or usable_cpus()
    if n_workers == 1 or len(items) < POOL_FROM:
        return (jobs.run(i, p) for i, p in enumerate(items))
    if threads:
        return _threaded(items, jobs, n_workers, window or 4 * n_workers)
    # Before any process starts: a call that every spawned worker would run again fails here.
    check_entry_point(
        "iter_processed", children_reimport_main=worker_context().get_start_method() != "fork"
    )
    chunk = max(1, min(_MAX_CHUNK, len(items) // (n_workers * 4)))
    limit = window or 4 * n_workers * chunk
    size = _fixed_size(cfg)
    if window is None and size:
        limit = min(limit, max(2 * n_workers * chunk, _RING_BYTES // size)) + hold
    if size and limit <= hold:
        raise ValueError(f"window={limit} must be more than borrow - 1 = {hold}")
    hold = hold if size else 0  # results of other sizes are never borrowed
    return _pooled(items, jobs, n_workers, min(chunk, limit - hold), limit, size, borrow, hold)


class _Jobs:
    """What every input is processed with (pickled once per task): the image configuration,
    the target schema and, with one, every input's raw targets (sliced per task)."""

    def __init__(
        self, cfg: ImageConfig, schema: tuple[Column, ...], rows: list[tuple[object, ...]] | None
    ) -> None:
        self.cfg, self.schema, self.rows, self.start = cfg, schema, rows, 0

    def part(self, start: int, stop: int) -> _Jobs:
        """The jobs of inputs ``start..stop - 1`` (the rows a task needs, not all of them)."""
        part = _Jobs(self.cfg, self.schema, None if self.rows is None else self.rows[start:stop])
        part.start = start
        return part

    def run(self, i: int, path: str) -> Result:
        """Process input ``i`` (an index of the whole sequence)."""
        targets = self.rows[i - self.start] if self.rows is not None else ()
        return process_file(i, path, self.cfg, self.schema, targets)


def _threaded(items: list[str], jobs: _Jobs, n: int, limit: int) -> Generator[Result, None, None]:
    """In-order results from ``n`` threads of this process, at most ``limit`` in flight:
    Pillow's decoders, its resize and hashlib release the GIL, and no process starts."""
    with ThreadPoolExecutor(n, thread_name_prefix="h5forge-preprocess") as pool:
        pending: deque[Future[Result]] = deque()
        try:
            for i, p in enumerate(items):
                pending.append(pool.submit(jobs.run, i, p))
                if len(pending) >= limit:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def _fixed_size(cfg: ImageConfig) -> int | None:
    """Bytes of every processed sample when they are all the same size, else None."""
    if cfg.layout != "decoded" or cfg.resize == "none" or cfg.size is None:
        return None
    return cfg.size[0] * cfg.size[1] * (1 if cfg.mode == "L" else 3)


def _start_worker(owner: int) -> None:
    """A pool worker's set-up: end with ``owner``; one torch thread (the resize kernel's), as
    the pool already runs one process per core."""
    import torch

    end_with_owner(owner)
    torch.set_num_threads(1)


def _process_chunk(
    start: int, paths: list[str], jobs: _Jobs, ring: tuple[str, int, int] | None = None
) -> list[Result | InRing]:
    # Module level so that spawn/forkserver workers can unpickle it by name.
    if ring is None:
        return [jobs.run(start + i, p) for i, p in enumerate(paths)]
    path, size, slots = ring
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:  # the ring cannot be reached from here: send the bytes the slow way
        return _process_chunk(start, paths, jobs)
    out: list[Result | InRing] = []
    try:
        for i, p in enumerate(paths):
            r = jobs.run(start + i, p)
            if isinstance(r, Processed) and len(r.data) == size:
                try:
                    if os.pwrite(fd, r.data, (r.index % slots) * size) == size:
                        out.append(InRing(r.index, r.shape, r.digest, r.targets))
                        continue
                except OSError:  # e.g. the shared-memory folder is full: send it the slow way
                    pass
            out.append(r)
    finally:
        os.close(fd)
    return out


def _pooled(
    paths: list[str],
    jobs: _Jobs,
    workers: int,
    chunk: int,
    window: int,
    size: int | None,
    borrow: int,
    hold: int,
) -> Generator[Result, None, None]:
    ring = Ring(size, window) if size else None
    try:
        yield from _pooled_with(paths, jobs, workers, chunk, window, ring, borrow, hold)
    finally:
        if ring is not None:
            ring.close()


def _pooled_with(
    paths: list[str],
    jobs: _Jobs,
    workers: int,
    chunk: int,
    window: int,
    ring: Ring | None,
    borrow: int,
    hold: int,
) -> Generator[Result, None, None]:
    n = len(paths)
    ctx = worker_context()
    check_main_importable(ctx)
    chosen = multiprocessing.get_start_method(allow_none=True)
    pool = ProcessPoolExecutor(
        max_workers=min(workers, -(-n // chunk)),
        mp_context=ctx,
        initializer=_start_worker,
        initargs=(os.getpid(),),
    )
    spec = ring.spec if ring is not None else None
    pending: deque[tuple[int, int, Future[list[Result | InRing]]]] = deque()
    in_flight = 0  # submitted and not yet yielded
    next_start = 0
    done = False
    try:
        while pending or next_start < n:
            # An input reuses the slot of the one ``window`` before it: submitted only once
            # that one was yielded and ``hold`` more after it (the consumer may keep them).
            while next_start < n and in_flight + min(chunk, n - next_start) + hold <= window:
                stop = min(n, next_start + chunk)
                part = jobs.part(next_start, stop)
                try:
                    with _interrupt_after():  # a submit may start a worker
                        task = pool.submit(
                            _process_chunk, next_start, paths[next_start:stop], part, spec
                        )
                except (BrokenProcessPool, OSError) as e:  # a worker died before this submit
                    # CPython 3.11 marks the pool broken and closes its call queue's reader
                    # without the lock a submit holds: a submit that passed the check and
                    # starts a worker on demand then pickles the closed queue and raises
                    # OSError('handle is closed') (seen once in CI, a worker killed).
                    if isinstance(e, OSError) and not getattr(pool, "_broken", False):
                        raise
                    first = pending[0][:2] if pending else (next_start, stop)
                    raise _died(paths, *first, ctx) from e
                pending.append((next_start, stop, task))
                in_flight += stop - next_start
                next_start = stop
            start, stop, task = pending.popleft()
            try:
                results = task.result()
            except BrokenProcessPool as e:
                raise _died(paths, start, stop, ctx) from e
            for r in results:
                in_flight -= 1
                if isinstance(r, InRing):
                    assert ring is not None
                    # The consumer is done with it when it asks for the ``borrow``-th result
                    # after it; only then can the loop above submit the input that reuses the
                    # slot.
                    yield ring.borrow(r) if borrow else ring.take(r)
                else:
                    yield r
        done = True
    finally:
        for _, _, task in pending:
            task.cancel()
        if not done:
            _stop_workers(pool)
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except RuntimeError:
            # Ctrl-C while the pool was starting its manager thread ("cannot join thread before
            # it is started"): let the interrupt through, not this; any worker it started ends
            # with this process (end_with_owner).
            if done:
                raise
        finally:
            unchoose(chosen)


@contextmanager
def _interrupt_after() -> Iterator[None]:
    """Hold a Ctrl-C that comes while the block runs until it has run, then raise it.

    A submit starts a worker on demand. A forkserver worker is asked for over a socket, and
    a KeyboardInterrupt between connecting and sending the request's file descriptors makes
    the fork server die with a traceback (EOFError, CPython 3.11) on the terminal of a build
    that was only interrupted. Only the main thread's handler raises it, so elsewhere (and
    where SIGINT is ignored or not Python's) the block runs as it is.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    held: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])


def _died(paths: list[str], start: int, stop: int, ctx: BaseContext) -> BrokenProcessPool:
    return BrokenProcessPool(
        f"a worker process died while processing inputs {start}..{stop - 1} (first: "
        f"{paths[start]!r}): a crashing decoder or the out-of-memory killer; rerun "
        "with workers=1 to see which file" + reimport_hint(ctx.get_start_method())
    )


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's workers when the pack stops early (an error, Ctrl-C, a dead worker):
    their results are not wanted, and ``shutdown(wait=True)`` joins them.

    A dead worker alone is not enough: CPython (seen in 3.11) marks the pool broken and kills the
    workers it knows of without the lock ``submit`` holds while it starts a worker on demand,
    so a worker started by a submit racing with that is never stopped, and the shutdown
    waits for it forever (a worker killed while the pool was starting hung the build). Only
    this thread submits, so once it is here no worker can be added behind this loop.
    """
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()
