"""Variable-length targets of a batch in one piece: what a DataLoader worker sends.

A batch's boxes (or multilabel index lists) are B small tensors; a worker handing them over one
by one pays a shared-memory file per tensor (about 0.1 ms each: 192 of them for 64 samples'
boxes dicts, more than reading the batch). :class:`Ragged` keeps every sample's rows back to
back in one tensor with the counts, pickles as that, and unpickles, in the receiving process,
as the list of per-sample values (views of the one tensor), so a batch's boxes cross the
process boundary as a single tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from h5forge.read.tv import xyxy_boxes

__all__ = ["Ragged", "unpack"]


class Ragged:
    """``kind`` ``"boxes"`` or ``"boxes+iscrowd"`` (``rows`` ``(sum M, 6) float32``; ``canvas``
    each sample's (H, W); the second also gives each sample's ``iscrowd``) or ``"indices"``
    (``rows`` ``(sum k,) int32``); ``counts``: rows per sample."""

    def __init__(
        self,
        kind: str,
        rows: torch.Tensor,
        counts: list[int],
        canvas: list[tuple[int, int]],
    ) -> None:
        self.kind, self.rows, self.counts, self.canvas = kind, rows, counts, canvas

    def __reduce__(self) -> tuple[Any, ...]:
        return unpack, (self.kind, self.rows, self.counts, self.canvas)


def unpack(
    kind: str, rows: torch.Tensor, counts: list[int], canvas: list[tuple[int, int]]
) -> list[Any]:
    """The per-sample values of a :class:`Ragged` (what it unpickles as)."""
    if kind == "indices":  # copies: a sample's list never holds the batch's memory
        return list(rows.to(torch.int64).split_with_sizes(counts))
    make = xyxy_boxes()
    # split_with_sizes, not torch.split: the same views without torch.split's Python layers
    # (~5 us of a 64-sample batch's ~85, all spent in the training process)
    boxes: Any = rows[:, :4].contiguous().split_with_sizes(counts)  # copies, as the next two
    if make is not None:
        boxes = [make(b, hw) for b, hw in zip(boxes, canvas, strict=True)]
    labels = rows[:, 4].to(torch.int64).split_with_sizes(counts)
    if kind == "boxes+iscrowd":
        crowd = rows[:, 5].to(torch.uint8).split_with_sizes(counts)
        return [
            {"boxes": b, "labels": y, "iscrowd": c}
            for b, y, c in zip(boxes, labels, crowd, strict=True)
        ]
    return [{"boxes": b, "labels": y} for b, y in zip(boxes, labels, strict=True)]
