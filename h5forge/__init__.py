"""h5forge: verified, training-ready HDF5 image assets and a fast PyTorch Dataset to read them."""

from __future__ import annotations

from h5forge.errors import (
    ChecksumError,
    EmptyDatasetError,
    H5ForgeError,
    IntegrityError,
    MissingExtraError,
    TooManyBadImagesError,
    UnsafeArchiveError,
    UnsealedFileError,
)

__version__ = "0.1.0"

__all__ = [
    "ChecksumError",
    "EmptyDatasetError",
    "H5ForgeError",
    "IntegrityError",
    "MissingExtraError",
    "TooManyBadImagesError",
    "UnsafeArchiveError",
    "UnsealedFileError",
    "__version__",
]
