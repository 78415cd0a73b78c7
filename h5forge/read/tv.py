"""torchvision's ``tv_tensors`` where torchvision imports (the ``vision`` extra), else None:
the reader's boxes, masks and images are then plain tensors of the same shapes."""

from __future__ import annotations

import functools
from types import ModuleType

__all__ = ["tv_tensors"]


@functools.cache
def tv_tensors() -> ModuleType | None:
    """``torchvision.tv_tensors``, or None when torchvision is not installed."""
    try:
        from torchvision import tv_tensors as tv
    except ImportError:
        return None
    return tv
