"""A local path for a part: the file itself when local, else a temporary download."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from h5forge.location import Location

__all__ = ["local_copy"]


@contextlib.contextmanager
def local_copy(where: Location, tmp_dir: str | os.PathLike[str] | None) -> Iterator[str]:
    """A local path for ``where``: itself when local, else a download deleted afterwards.

    The download is a temporary file in ``tmp_dir``; nothing is created for a local part.
    """
    if where.is_local:
        yield where.path
        return
    fd, local = tempfile.mkstemp(prefix="h5forge-merge-", suffix=".h5", dir=tmp_dir)
    try:
        where.download(fd)  # ranged reads bounded in time; the listed size exactly
        yield local
    finally:
        os.unlink(local)
