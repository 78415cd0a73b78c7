"""torchvision's ``tv_tensors`` where torchvision imports (the ``vision`` extra), else None:
the reader's boxes, masks and images are then plain tensors of the same shapes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

__all__ = ["tv_tensors", "xyxy_boxes"]


@functools.cache
def tv_tensors() -> ModuleType | None:
    """``torchvision.tv_tensors``, or None when torchvision is not installed."""
    try:
        from torchvision import tv_tensors as tv
    except ImportError:
        return None
    return tv


@functools.cache
def xyxy_boxes() -> Callable[[torch.Tensor, tuple[int, int]], Any] | None:
    """``make(boxes, (H, W))``: an ``(M, 4)`` float32 tensor as a ``BoundingBoxes`` (XYXY) on
    that canvas; None without torchvision. A loader makes one per sample of a batch in the
    training process, where the constructor's checks and conversions of what the reader has
    already made right cost twice the wrapping itself, so this is ``BoundingBoxes._wrap``
    when that makes exactly the box the constructor makes (compared here, once), else the
    constructor."""
    tv = tv_tensors()
    if tv is None:
        return None
    cls, xyxy = tv.BoundingBoxes, tv.BoundingBoxFormat.XYXY

    def public(t: torch.Tensor, hw: tuple[int, int]) -> Any:
        return cls(t, format="XYXY", canvas_size=hw)

    def wrapped(t: torch.Tensor, hw: tuple[int, int]) -> Any:
        return cls._wrap(t, format=xyxy, canvas_size=hw, check_dims=False)

    probe = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    try:
        a, b = public(probe, (5, 6)), wrapped(probe, (5, 6))
        same = type(a) is type(b) and a.__dict__ == b.__dict__ and torch.equal(a, b)
    except Exception:  # noqa: BLE001 - another torchvision: its constructor is the contract
        same = False
    return wrapped if same else public
