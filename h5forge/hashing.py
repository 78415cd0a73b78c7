"""The sha256 of a whole file, local or at any fsspec URL, in large streamed reads.

Fetch checks archives and cache entries with it, publish reads back what it wrote, and the
verify and scale stages compare files with their sidecars: one function, one chunk size, so a
digest means the same thing everywhere.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import fsspec

__all__ = ["CHUNK", "sha256_file", "sha256_of"]

CHUNK = 8 << 20  # bytes per read: large sequential reads, few round trips to a remote store


def sha256_file(
    path_or_url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    chunk: int = CHUNK,
) -> str:
    """Stream a local or remote file through sha256 in ``chunk``-byte reads.

    Args:
        path_or_url: local path or fsspec URL.
        storage_options: passed to fsspec.
        chunk: bytes per read.

    Returns:
        The hex digest.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 byte")
    fs, path = fsspec.core.url_to_fs(os.fspath(path_or_url), **dict(storage_options or {}))
    return sha256_of(fs, path, chunk)


def sha256_of(fs: Any, path: str, chunk: int = CHUNK) -> str:
    """The hex sha256 of ``path`` on the fsspec filesystem ``fs`` (already resolved)."""
    digest = hashlib.sha256()
    with fs.open(path, "rb", block_size=chunk) as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
