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
    fs, path = where.fs, where.path
    if where.is_local:
        yield path
        return
    fd, local = tempfile.mkstemp(prefix="h5forge-merge-", suffix=".h5", dir=tmp_dir)
    os.close(fd)
    try:
        fs.get_file(path, local)
        yield local
    finally:
        os.unlink(local)
