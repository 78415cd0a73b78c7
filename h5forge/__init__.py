"""h5forge: verified, training-ready HDF5 image assets and a fast PyTorch Dataset to read them.

The public API is re-exported here. Heavy modules (torch, h5py, Pillow) load on first use, so
``import h5forge`` and the CLI start fast.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from h5forge.errors import (
    BusyError,
    ChecksumError,
    EmptyDatasetError,
    H5ForgeError,
    IntegrityError,
    MainReimportError,
    MissingExtraError,
    TooManyBadImagesError,
    UnsafeArchiveError,
    UnsafePathError,
    UnsealedFileError,
    UnsupportedPlatformError,
)

__version__ = "0.2.0"

_LAZY = {
    "Location": "h5forge.location",
    "fetch": "h5forge.fetch.sources",
    "Catalog": "h5forge.discover.catalog",
    "discover": "h5forge.discover.catalog",
    "ImageConfig": "h5forge.preprocess.config",
    "PackConfig": "h5forge.pack.config",
    "pack": "h5forge.pack.writer",
    "PackResult": "h5forge.pack.writer",
    "verify": "h5forge.verify.checks",
    "VerifyReport": "h5forge.verify.checks",
    "publish": "h5forge.publish.storage",
    "read_sidecar": "h5forge.publish.sidecar",
    "write_preview": "h5forge.publish.preview",
    "H5ImageDataset": "h5forge.read.dataset",
    "H5MultiDataset": "h5forge.read.multi",
    "ReadOptions": "h5forge.read.options",
    "MixingSampler": "h5forge.read.mixing",
    "Sampler": "h5forge.read.sampler",
}


class _Package(types.ModuleType):
    """``h5forge`` itself: a stage package never hides the function of the same name.

    Importing ``h5forge.pack.writer`` binds the package ``h5forge.pack`` on ``h5forge``; without
    this, ``from h5forge import pack`` would then give the package instead of the function.
    Stage modules are imported by their full name (``from h5forge.pack import writer``).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "BusyError",
    "ChecksumError",
    "EmptyDatasetError",
    "H5ForgeError",
    "IntegrityError",
    "MainReimportError",
    "MissingExtraError",
    "TooManyBadImagesError",
    "UnsafeArchiveError",
    "UnsafePathError",
    "UnsealedFileError",
    "UnsupportedPlatformError",
    "__version__",
    *sorted(_LAZY),
]


#: Public names an older h5forge had -> the name each has now. ImportError, not AttributeError:
#: ``from h5forge import read_manifest`` would turn an AttributeError into a bare "cannot import
#: name" and drop the new name.
_RENAMED = {"read_manifest": "read_sidecar"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _RENAMED:
        new = _RENAMED[name]
        raise ImportError(
            f"h5forge.{name} was renamed h5forge.{new} (same arguments, same result); use {new}",
            name="h5forge",
        )
    raise AttributeError(f"module 'h5forge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
