"""h5forge: verified, training-ready HDF5 image assets and a fast PyTorch Dataset to read them.

The public API is re-exported here. Heavy modules (torch, h5py, Pillow) load on first use, so
``import h5forge`` and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from h5forge.errors import (
    BusyError,
    ChecksumError,
    EmptyDatasetError,
    H5ForgeError,
    IntegrityError,
    MissingExtraError,
    TooManyBadImagesError,
    UnsafeArchiveError,
    UnsafePathError,
    UnsealedFileError,
)

__version__ = "0.1.0"

_LAZY = {
    "H5ImageDataset": "h5forge.dataset",
    "ImageConfig": "h5forge.images",
    "Catalog": "h5forge.catalog",
    "discover": "h5forge.catalog",
    "pack": "h5forge.writer",
    "PackResult": "h5forge.writer",
    "verify": "h5forge.verify",
    "VerifyReport": "h5forge.verify",
    "fetch": "h5forge.sources",
    "publish": "h5forge.storage",
    "read_manifest": "h5forge.storage",
    "write_preview": "h5forge.preview",
}

__all__ = [
    "BusyError",
    "ChecksumError",
    "EmptyDatasetError",
    "H5ForgeError",
    "IntegrityError",
    "MissingExtraError",
    "TooManyBadImagesError",
    "UnsafeArchiveError",
    "UnsafePathError",
    "UnsealedFileError",
    "__version__",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'h5forge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
