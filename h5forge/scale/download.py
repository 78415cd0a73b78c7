"""A local path for a part URL: the file itself when local, else a temporary download."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from h5forge.asset.open import is_local, url_to_fs

__all__ = ["local_copy"]


@contextlib.contextmanager
def local_copy(
    url: str, options: dict[str, Any] | None, tmp_dir: str | os.PathLike[str] | None
) -> Iterator[str]:
    """A local path for ``url``: itself when local, else a download deleted afterwards.

    The download is a temporary file in ``tmp_dir``; nothing is created for a local part.
    """
    fs, path = url_to_fs(url, options)
    if is_local(fs):
        yield path
        return
    fd, local = tempfile.mkstemp(prefix="h5forge-merge-", suffix=".h5", dir=tmp_dir)
    os.close(fd)
    try:
        fs.get_file(path, local)
        yield local
    finally:
        os.unlink(local)
