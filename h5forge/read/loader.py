"""The DataLoader of :meth:`H5ImageDataset.loader <h5forge.read.dataset.H5ImageDataset.loader>`.

torch's "automatic batching disabled" mode: ``batch_size=None`` over a ``BatchSampler``, so each
worker is handed a whole batch of indices and reads it with one call. The order is an
:class:`h5forge.read.sampler.Sampler` unless the caller gives a sampler.

:class:`Loader` counts the batches it yielded in the current epoch, so its ``state_dict()`` says
where the epoch is (Lightning's convention: ``state_dict`` / ``load_state_dict`` on the loader).
With the default Sampler the state is its global position, so it resumes on any world size; with
another sampler it is a batch count, and resuming skips that many batches of the sampler's order
(drawing indices, reading nothing), which is right when the sampler repeats its order for an
epoch (``DistributedSampler`` after ``set_epoch``, ``SequentialSampler``).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from h5forge.read import collate as _collate
from h5forge.read.order import shown
from h5forge.read.sampler import Sampler

__all__ = ["BatchLoading", "Loader", "batch_loader"]


class _Ahead(list[int]):
    """A batch's indices, and ``ahead``: the indices of the batch the same worker reads next
    (None at the end of the epoch). Pickled to the worker with the batch."""

    ahead: list[int] | None = None


class _Batches(Dataset[tuple[Any, Any]]):
    """Indexed by a list of indices (a ``BatchSampler``'s batch): one ``read`` each, after
    ``prefetch`` of the batch the worker reads next (when the sampler says which)."""

    def __init__(
        self,
        dataset: Sized,
        read: Callable[[list[int]], Any],
        prefetch: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.dataset = dataset
        self.read = read
        self.prefetch = prefetch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> Any:
        ahead = getattr(indices, "ahead", None)
        if ahead and self.prefetch is not None:
            self.prefetch(ahead)  # fetched while this batch is read and handed over
        return self.read(indices)


class _Skipping(BatchSampler):
    """A BatchSampler whose next iteration skips ``skip`` batches (a resumed foreign sampler),
    and, with ``lookahead`` > 0, yields each batch as an :class:`_Ahead` naming the batch
    ``lookahead`` places later: the next one of the same worker, as torch hands batches to
    its workers in turn."""

    skip = 0
    lookahead = 0

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        batches = (b for k, b in enumerate(super().__iter__()) if k >= skip)
        if not self.lookahead:
            yield from batches
            return
        window: deque[list[int]] = deque()
        for batch in batches:
            window.append(batch)
            if len(window) > self.lookahead:
                first = _Ahead(window.popleft())
                first.ahead = window[-1]
                yield first
        yield from window


def _forks(loader: DataLoader[Any]) -> bool:
    """Whether ``loader``'s workers start by ``fork`` (inheriting this process's memory)."""
    ctx = loader.multiprocessing_context
    if ctx is not None:
        return bool(ctx.get_start_method() == "fork")
    mp = torch.multiprocessing
    # The first of get_all_start_methods() is the default; reading it fixes nothing.
    return (mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]) == "fork"


class Loader(DataLoader[Any]):
    """A DataLoader that knows where its epoch is: ``state_dict()`` / ``load_state_dict()``.

    Save ``loader.state_dict()`` with the checkpoint (in a distributed job, rank 0's); after
    building the same loader in the new job, ``loader.load_state_dict(state)`` makes the next
    iteration yield exactly the batches the interrupted one had not yet yielded.
    """

    sampler: _Skipping  # a batch sampler: automatic batching is off

    def __init__(
        self, *args: Any, before_fork: Callable[[], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._base = 0  # batches of the epoch skipped by this iteration (a resumed one)
        self._yielded = 0  # batches handed out by this iteration
        self._before_fork = before_fork

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._base, self._yielded = self.sampler.skip, 0
        if isinstance(self.dataset, _Batches) and self.dataset.prefetch is not None:
            self.sampler.lookahead = max(1, self.num_workers)  # each worker's own next batch
        if self._before_fork is not None and self.num_workers > 0 and _forks(self):
            self._before_fork()  # what forked workers inherit instead of redoing each epoch
        return self._count(super().__iter__())

    def _count(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self._yielded += 1
            yield batch

    @property
    def order(self) -> Any:
        """The sampler deciding the order of the samples."""
        return self.sampler.sampler

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch is: ``{"sampler": ..., "batches": ...}`` (plain ints and strings)."""
        order, batches = self.order, self._base + self._yielded
        if not isinstance(order, Sampler):
            return {"sampler": None, "batches": batches}
        return {"sampler": order.state(self._yielded * self.sampler.batch_size), "batches": batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration.

        Raises:
            ValueError: the state is malformed or was saved for another order.
        """
        if not isinstance(state, dict) or set(state) != {"sampler", "batches"}:
            raise ValueError(f"not a Loader state: {state!r:.200}; expected Loader.state_dict()")
        order, batches = self.order, state["batches"]
        if isinstance(order, Sampler):
            order.load_state_dict(state["sampler"])
            return
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise ValueError(f"state batches={shown(batches)} must be an int >= 0")
        self.sampler.skip = batches


def batch_loader(
    dataset: Sized,
    read: Callable[[list[int]], Any],
    batch_size: int,
    *,
    shuffle: bool,
    sampler: Iterable[int] | None,
    drop_last: bool,
    generator: torch.Generator | None,
    seed: int | None = None,
    before_fork: Callable[[], None] | None = None,
    prefetch: Callable[[list[int]], None] | None = None,
    **dataloader_kwargs: Any,
) -> Loader:
    """A :class:`Loader` calling ``read(indices)`` once per batch of ``dataset`` (see
    ``H5ImageDataset.loader``). Without ``sampler``, the order is a :class:`Sampler` with
    ``shuffle``, ``drop_last`` and ``seed`` (default: one drawn from ``generator`` when given,
    else 0), ranks from ``torch.distributed`` when it is initialised. ``before_fork`` is called
    before each iteration whose workers start by ``fork`` (what they should inherit)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={shown(batch_size)} must be an int >= 1")
    for key in ("batch_size", "batch_sampler", "collate_fn", "shuffle"):
        if key in dataloader_kwargs:
            raise ValueError(
                f"loader() sets {key} itself; pass batch_size/shuffle/sampler "
                "to loader(), or build a DataLoader over the dataset directly"
            )
    if sampler is not None and shuffle:
        raise ValueError(
            "give either shuffle=True or a sampler, not both (a sampler decides the order itself)"
        )
    if sampler is not None and seed is not None:
        raise ValueError("seed= is the default Sampler's; a given sampler has its own seed")
    order: Any = sampler
    if order is None:
        if seed is None:
            seed = 0 if generator is None else int(torch.randint(2**62, (1,), generator=generator))
        order = Sampler(dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return Loader(
        _Batches(dataset, read, prefetch),
        batch_size=None,
        collate_fn=_collate.send_batch,
        sampler=_Skipping(order, batch_size, drop_last),
        before_fork=before_fork,
        **dataloader_kwargs,
    )


class BatchLoading:
    """``loader()`` for a dataset that reads a batch of indices with one ``_read_batch`` call
    (:class:`~h5forge.read.dataset.H5ImageDataset`, :class:`~h5forge.read.multi.H5MultiDataset`)."""

    def _read_batch(self, indices: Sequence[int], *, use_slots: bool) -> Any:
        raise NotImplementedError

    def _before_fork(self) -> None:
        """Work done once here so that forked workers inherit it (nothing by default)."""

    def _prefetch(self, indices: Sequence[int]) -> None:
        """Start fetching, in the background, what reading ``indices`` will need (a worker's
        next batch, while it reads this one; nothing by default)."""

    def loader(
        self,
        batch_size: int = 64,
        *,
        shuffle: bool = False,
        sampler: Iterable[int] | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        **dataloader_kwargs: Any,
    ) -> Loader:
        """A DataLoader that reads each batch with one :meth:`read_batch` call.

        The fast way to feed training: ``for images, labels in ds.loader(64, shuffle=True,
        num_workers=2): ...``. It is torch's own "automatic batching disabled" mode
        (``batch_size=None`` over a ``BatchSampler``), so every DataLoader option works:
        ``num_workers``, ``persistent_workers``, ``pin_memory``, ``prefetch_factor``,
        ``multiprocessing_context``, ``worker_init_fn``.

        The order is an :class:`h5forge.Sampler` (seeded, a new order each epoch, each rank of
        a ``torch.distributed`` job its share); the :class:`~h5forge.read.loader.Loader`'s
        ``state_dict()`` saved mid-epoch, loaded in a new job (any number of ranks), yields the
        rest of that epoch.

        Memory: each worker keeps up to 6 batch-sized buffers (``memfd``, shared with this
        process; 9.6 MB each for 64 x 224 x 224 x 3) and reuses one once every tensor of the
        batch it held is gone; if the consumer keeps more batches alive than that, further
        batches get fresh shared memory, as with torch's own collate. See
        :mod:`h5forge.read.batches`.

        Args:
            batch_size: samples per batch.
            shuffle: a fresh random order each epoch; not with ``sampler``.
            sampler: the order of the samples, e.g. ``Sampler(ds, exact=True, shuffle=False)``.
            drop_last: drop the last batch when it is smaller than ``batch_size`` (and, across
                ranks, the tail that does not divide evenly).
            generator: draws the seed when ``seed`` is not given.
            seed: the Sampler's seed (default 0, or drawn from ``generator``).
            **dataloader_kwargs: passed to ``torch.utils.data.DataLoader``.
        """
        return batch_loader(
            cast(Sized, self),
            functools.partial(self._read_batch, use_slots=True),
            batch_size,
            shuffle=shuffle,
            sampler=sampler,
            drop_last=drop_last,
            generator=generator,
            seed=seed,
            before_fork=self._before_fork,
            prefetch=self._prefetch,
            **dataloader_kwargs,
        )
