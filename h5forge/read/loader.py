"""The DataLoader of :meth:`H5ImageDataset.loader <h5forge.read.dataset.H5ImageDataset.loader>`.

torch's "automatic batching disabled" mode: ``batch_size=None`` over a ``BatchSampler``, so each
worker is handed a whole batch of indices and reads it with one call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from h5forge.read import batches as _batches

__all__ = ["batch_loader"]


class _Batches(Dataset[tuple[Any, Any]]):
    """Indexed by a list of indices (a ``BatchSampler``'s batch): one ``read`` each."""

    def __init__(self, dataset: Sized, read: Callable[[list[int]], Any]) -> None:
        self.dataset = dataset
        self.read = read

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: list[int]) -> Any:
        return self.read(indices)


def batch_loader(
    dataset: Sized,
    read: Callable[[list[int]], Any],
    batch_size: int,
    *,
    shuffle: bool,
    sampler: Iterable[int] | None,
    drop_last: bool,
    generator: torch.Generator | None,
    **dataloader_kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader calling ``read(indices)`` once per batch of ``dataset`` (see ``loader``)."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1")
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
    order: Any = (
        sampler
        if sampler is not None
        else (
            RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        )
    )
    return DataLoader(
        _Batches(dataset, read),
        batch_size=None,
        collate_fn=_batches.send_batch,
        sampler=BatchSampler(order, batch_size, drop_last),
        **dataloader_kwargs,
    )
