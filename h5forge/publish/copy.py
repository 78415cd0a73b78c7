"""How publish cleans up and checks what it wrote: stale temp files, and the read-back.

Writes themselves are :meth:`h5forge.location.Location.put` (temp name, fsync, rename on a local
disk; temp files created exclusively and locked by their writer until just before the rename).
The cleanup of a killed publish's temp files (:func:`remove_stale_temps`) removes only those
whose lock it can take, and only regular files of this user with one link, never a symlink or
what it points to.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

from h5forge.errors import ChecksumError
from h5forge.files import NOFOLLOW, NONBLOCK
from h5forge.location import SIDECAR_SUFFIX, TEMP_MARK, Location
from h5forge.locks import flock

__all__ = ["read_back", "remove_stale_temps"]

log = logging.getLogger("h5forge.publish.storage")


def remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp files of ``name`` (and of its manifest) left by a killed publish.

    Call it under :func:`h5forge.locks.folder_lock`: a live publisher unlocks its temp file
    only under that lock, just before renaming it away.
    """
    prefixes = (f".{name}{TEMP_MARK}", f".{name}{SIDECAR_SUFFIX}{TEMP_MARK}")
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
        stale = [
            e.path
            for e in entries
            if e.name.startswith(prefixes) and e.is_file(follow_symlinks=False)
        ]
    for tmp in stale:
        try:  # never through a link, never blocking on a FIFO swapped in meanwhile
            fd = os.open(tmp, os.O_RDONLY | NOFOLLOW | NONBLOCK)
        except OSError:  # gone meanwhile, or now a link (ELOOP): not a temp file of ours
            continue
        try:
            st = os.fstat(fd)
            ours = (
                stat.S_ISREG(st.st_mode)
                and st.st_nlink == 1
                and (not hasattr(os, "getuid") or st.st_uid == os.getuid())
            )
            if ours and flock(fd, wait=False):
                log.info("removing %s, left by an interrupted publish", tmp)
                os.remove(tmp)
        finally:
            os.close(fd)


def read_back(where: Location, sha: str, size: int) -> None:
    """Compare the size and streamed sha256 of the file at ``where`` with the local file's."""
    fs, path = where.fs, where.path
    fs.invalidate_cache(path)
    found_size = fs.size(path)
    found_sha = where.sha256() if found_size == size else "(not read: size differs)"
    if found_size != size or found_sha != sha:
        fs.rm_file(path)
        raise ChecksumError(
            f"read-back of {str(where)!r} does not match the local file: expected sha256 {sha} "
            f"and {size} bytes, found {found_sha} and {found_size} bytes; the object was deleted, "
            "publish again",
            [
                f"sha256 expected={sha} actual={found_sha}",
                f"bytes expected={size} actual={found_size}",
            ],
        )
