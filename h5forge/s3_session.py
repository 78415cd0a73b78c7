"""One aiobotocore session per process for s3fs filesystems, whose botocore data loader (the
service models it has loaded) the whole process tree shares.

botocore's service models (the JSON every new S3 client is built from: ~0.15 s of CPU) are
loaded once per process tree. A forked reader worker's filesystem is a new one (fsspec
forgets its instances in a child), and its session used to load them all again, 0.2 s of
CPU per worker at the start of a first epoch; it now gets a session of its own that reads
them from the data loader it inherited (0.06 s).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["share_models"]

_MODELS: Any = None  # botocore's data loader of the first session made in this process tree
_SESSION: tuple[int, Any] | None = None  # (pid, the session of this process's filesystems)


def share_models(fs: Any) -> Any:
    """Give a new s3fs filesystem this process's session, whose data loader (the loaded
    models) the whole process tree shares. Not where the storage options make a session of
    their own (``session``, ``profile`` and other session options: s3fs's ``kwargs``), nor
    once a client exists. The session is never part of the filesystem's storage options:
    pickled (to a spawned worker, a Dask task), the filesystem makes its own again. Returns
    ``fs``."""
    global _MODELS, _SESSION
    if getattr(fs, "session", "?") is not None or getattr(fs, "kwargs", None):
        return fs
    if getattr(fs, "_s3", None) is not None:
        return fs
    if _SESSION is None or _SESSION[0] != os.getpid():
        from aiobotocore.session import AioSession

        session = AioSession()  # what s3fs makes when its options name no session option
        if _MODELS is None:
            _MODELS = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _MODELS)
        _SESSION = (os.getpid(), session)
    fs.session = _SESSION[1]
    return fs
