"""Smoke-load: read a finished asset the way training code will, and check what comes out.

The check opens the real :class:`h5forge.read.dataset.H5ImageDataset` in a ``torch`` ``DataLoader``
with worker processes, once per multiprocessing start method (``fork`` and ``spawn`` by
default), and compares every sample it receives with what the file declares: dtype ``uint8``,
shape, label (and its range), and the per-sample sha256 digest in ``/digests``. That proves the
dataset pickles, opens lazily in each worker and returns the bytes that were packed — the
properties a training job relies on and a file-level verify cannot see. Fixed-size (array
storage) files are read the fast way, whole batches through ``H5ImageDataset.loader()`` (worker
slots handed over as shared memory); files of varying sample sizes sample by sample.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from h5forge.errors import IntegrityError
from h5forge.lifetime import worker_init
from h5forge.location import Location
from h5forge.main_guard import check_entry_point
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.read.dataset import H5ImageDataset
from h5forge.smoke.expected import Expected, check_sample, read_expected

__all__ = ["MethodReport", "SmokeReport", "smoke_load"]

# A DataLoader worker that hangs (a deadlock after fork, a stalled remote read) must fail the
# check instead of blocking the pipeline forever.
_BATCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class MethodReport:
    """What one DataLoader run read.

    Attributes:
        start_method: ``fork``, ``spawn``, ``forkserver``, or ``main`` (no worker processes).
        samples: samples read and checked.
        seconds: wall time from creating the iterator to the last batch checked (worker
            start-up included, shutdown not).
        startup_seconds: time until every worker had delivered its first batch (worker
            start-up: milliseconds under fork, seconds under spawn).
        images_per_second: samples per second after start-up, checks included; over the whole
            run when there are no more batches than workers.
    """

    start_method: str
    samples: int
    seconds: float
    startup_seconds: float
    images_per_second: float


@dataclass(frozen=True)
class SmokeReport:
    """Result of :func:`smoke_load`; every sample it read matched the file.

    Attributes:
        url: the asset that was read.
        workers: DataLoader worker processes per run.
        batch_size: samples per batch.
        methods: one report per start method, in the order they ran.
        samples_checked: total samples read and checked over all runs.
        seconds: wall time of the whole check.
    """

    url: str
    workers: int
    batch_size: int
    methods: tuple[MethodReport, ...]
    samples_checked: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        """The slowest start method's rate (what a training job can count on)."""
        return min((m.images_per_second for m in self.methods), default=0.0)


def _as_list(batch: list[tuple[torch.Tensor, int]]) -> list[tuple[torch.Tensor, int]]:
    # Module-level so spawn workers can unpickle it; keeps variable-size images uncollated.
    return batch


def _spread(n_total: int, n_pick: int, shift: int) -> list[int]:
    """``n_pick`` indices spread evenly over ``range(n_total)``, shifted per run."""
    if n_pick >= n_total:
        return list(range(n_total))
    base = np.linspace(0, n_total - 1, n_pick).round().astype(np.int64)
    return sorted({int(i) for i in (base + shift) % n_total})


def _run_once(
    dataset: H5ImageDataset,
    indices: list[int],
    exp: Expected,
    *,
    method: str,
    workers: int,
    batch_size: int,
    url: str,
    worker_init_fn: Callable[[int], None] | None,
) -> tuple[MethodReport, list[str]]:
    options: dict[str, Any] = {
        "num_workers": workers,
        "multiprocessing_context": method if workers > 0 else None,
        "timeout": _BATCH_TIMEOUT_S if workers > 0 else 0,
        # Workers end with this process even when it is SIGKILLed (see h5forge.lifetime).
        "worker_init_fn": worker_init(worker_init_fn) if workers > 0 else None,
    }
    loader: Iterable[list[tuple[Any, Any]]]
    if exp.index.header.storage == "array":
        # Fixed-size samples: the way training reads them, whole batches through loader()
        # (worker slots handed to this process), then each sample of the batch checked.
        loader = (
            list(zip(images, labels.tolist(), strict=True))
            for images, labels in dataset.loader(batch_size, sampler=indices, **options)
        )
    else:  # samples of varying size: one by one, as a transform-less Dataset yields them
        loader = DataLoader(
            Subset(dataset, indices),
            batch_size=batch_size,
            shuffle=False,
            collate_fn=_as_list,
            **options,
        )
    failures: list[str] = []
    position = 0
    arrivals: list[tuple[float, int]] = []  # (seconds since start, batch size)
    start = end = time.perf_counter()
    for batch in loader:
        arrivals.append((time.perf_counter() - start, len(batch)))
        for image, label in batch:
            failures.extend(
                check_sample(
                    exp,
                    indices[position],
                    image,
                    label,
                    url,
                    max_pixels=dataset.options.max_pixels,
                )
            )
            position += 1
        end = time.perf_counter()
    # Up to the last batch checked: worker shutdown (a second or more under spawn) excluded.
    seconds = end - start
    if position != len(indices):
        failures.append(f"{url}: DataLoader returned {position} samples, expected {len(indices)}")
    # Workers start one after the other; once each has delivered a batch, all are up.
    warm = min(max(workers, 1), len(arrivals))
    startup = arrivals[warm - 1][0] if arrivals else seconds
    steady_n = sum(n for _, n in arrivals[warm:])
    steady_s = seconds - startup
    if steady_n > 0 and steady_s > 0:
        rate = steady_n / steady_s
    else:
        rate = position / seconds if seconds > 0 else 0.0
    return MethodReport(method, position, seconds, startup, rate), failures


def smoke_load(
    where: str | os.PathLike[str] | Location,
    *,
    workers: int = 2,
    batches: int = 4,
    batch_size: int = 32,
    start_methods: Sequence[str] = ("fork", "spawn"),
    worker_init_fn: Callable[[int], None] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> SmokeReport:
    """Read samples of a sealed asset through DataLoader workers and check each one.

    Args:
        where: local path or :class:`~h5forge.location.Location` of a sealed ``.h5``
            asset (a remote asset's Location carries its storage options).
        workers: DataLoader worker processes (0 reads in this process, once, and ignores
            ``start_methods``).
        batches: batches to read per start method.
        batch_size: samples per batch.
        start_methods: multiprocessing start methods to try, each in its own DataLoader.
        worker_init_fn: run first in each worker process (a module-level function, so that
            spawn workers can import it), e.g. to reset state inherited through ``fork``.
        max_pixels: the reader's decode bound (``max_pixels=`` of
            :class:`~h5forge.read.dataset.H5ImageDataset`); a build passes the
            ``max_image_pixels`` it packed with.

    Returns:
        A report with the samples checked and the images per second of each run.

    Raises:
        ValueError: an argument is out of range or a start method is unknown on this platform.
        UnsealedFileError: the file is not a sealed h5forge asset.
        IntegrityError: a sample read back differs from the file's dtype, shape, label or
            digest; ``failures`` lists each one.
    """
    if workers < 0:
        raise ValueError(f"workers={workers} is negative; use 0 (no worker processes) or more")
    if batches < 1 or batch_size < 1:
        raise ValueError(f"batches={batches} and batch_size={batch_size} must both be >= 1")
    available = multiprocessing.get_all_start_methods()
    methods: tuple[str, ...] = ("main",) if workers == 0 else tuple(start_methods)
    if not methods:
        raise ValueError("start_methods is empty; give at least one, e.g. ('spawn',)")
    unknown = [m for m in methods if m != "main" and m not in available]
    if unknown:
        raise ValueError(
            f"start methods {unknown} are not available on this platform; it offers {available}"
        )
    check_entry_point(
        "smoke_load", children_reimport_main=any(m in ("spawn", "forkserver") for m in methods)
    )
    start = time.perf_counter()
    where = Location.of(where)
    url = where.url
    dataset = H5ImageDataset(where, max_pixels=max_pixels)
    n_total = len(dataset)
    if n_total == 0:
        raise IntegrityError(f"{url} holds no samples; there is nothing to smoke-load")
    n_pick = min(n_total, batches * batch_size)
    plan = [_spread(n_total, n_pick, shift) for shift in range(len(methods))]
    exp = read_expected(where, {i for idx in plan for i in idx})
    if exp.index.header.num_samples != n_total:
        raise IntegrityError(
            f"{url}: H5ImageDataset has {n_total} samples, the file header says "
            f"{exp.index.header.num_samples}"
        )
    reports: list[MethodReport] = []
    for method, indices in zip(methods, plan, strict=True):
        report, failures = _run_once(
            dataset,
            indices,
            exp,
            method=method,
            workers=workers,
            batch_size=batch_size,
            url=url,
            worker_init_fn=worker_init_fn,
        )
        if failures:
            raise IntegrityError(
                f"smoke-load of {url} failed with start method {method!r}: "
                f"{len(failures)} problem(s) in {report.samples} samples read",
                failures,
            )
        reports.append(report)
    return SmokeReport(
        url=url,
        workers=workers,
        batch_size=batch_size,
        methods=tuple(reports),
        samples_checked=sum(r.samples for r in reports),
        seconds=time.perf_counter() - start,
    )
