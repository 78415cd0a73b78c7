"""How publish writes bytes: temp name, fsync, rename where the store has renames, verified.

Local writes never go through a name someone planted: temp files are created exclusively
(:func:`h5forge.files.create_exclusive`) and renamed over their target, which replaces a
symlink at the final name instead of writing through it. A temp file stays locked
(:func:`h5forge.locks.flock`) by its writer until just before its rename, so the cleanup of a
killed publish's temp files (:func:`remove_stale_temps`) removes only those whose lock it can
take, and only regular files of this user with one link, never a symlink or what it points to.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import posixpath
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from fsspec.implementations.local import LocalFileSystem

from h5forge.errors import ChecksumError
from h5forge.files import NOFOLLOW, NONBLOCK, create_exclusive
from h5forge.hashing import CHUNK, sha256_of
from h5forge.locks import flock
from h5forge.publish.manifest import MANIFEST_SUFFIX

__all__ = ["TempFile", "fsync_dir", "put", "read_back", "remove_stale_temps", "temp_copy"]

log = logging.getLogger("h5forge.publish.storage")


def put(fs: Any, path: str, *, local: str | None = None, data: bytes | None = None) -> None:
    """Write a file: temp + fsync + rename where the store has real renames, else upload."""
    if not isinstance(fs, LocalFileSystem):
        if local is not None:
            fs.put_file(local, path)
        else:
            fs.pipe_file(path, data)
        fs.invalidate_cache(path)
        return
    parent = posixpath.dirname(path)
    fs.makedirs(parent, exist_ok=True)
    with temp_copy(path, local, data) as tmp:
        tmp.unlock()
        os.rename(tmp.path, path)
    fsync_dir(parent)  # persist the rename itself


_TEMP = ".tmp-"  # in the name of a temp file: ".NAME.tmp-TOKEN"


class TempFile:
    """A temp file being written: its path, and the open handle whose flock marks it live."""

    def __init__(self, path: str, handle: IO[bytes]) -> None:
        self.path, self._handle = path, handle

    def unlock(self) -> None:
        """Close the handle (releasing the flock); the file stays."""
        self._handle.close()


@contextmanager
def temp_copy(path: str, local: str | None, data: bytes | None = None) -> Iterator[TempFile]:
    """A fsynced copy of ``local`` (or ``data``) at a temp name beside ``path``, locked.

    The temp file stays flock-ed until :meth:`TempFile.unlock`, which marks it as live: a later
    publish removes only temp files whose lock it can take (their writer died, e.g. killed).
    The temp file is removed on exit unless it was renamed away.
    """
    parent, name = posixpath.split(path)
    token = secrets.token_hex(6)
    tmp = posixpath.join(parent, f".{name}{_TEMP}{token}")
    # Created under another name and locked before it gets its temp name, so a temp file
    # whose lock can be taken is always a dead writer's.
    fresh = posixpath.join(parent, f".{name}.new-{token}")
    # Exclusive: a name planted beside the destination (a symlink, a hard link) is refused.
    out = os.fdopen(create_exclusive(fresh, 0o644), "wb")
    try:
        flock(out.fileno())
        os.rename(fresh, tmp)
        src: IO[bytes]
        with open(local, "rb") if local else io.BytesIO(data or b"") as src:
            while block := src.read(CHUNK):
                out.write(block)
        out.flush()
        os.fsync(out.fileno())
        yield TempFile(tmp, out)
    finally:
        out.close()
        for leftover in (fresh, tmp):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)


def remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp files of ``name`` (and of its manifest) left by a killed publish.

    Call it under :func:`h5forge.locks.folder_lock`: a live publisher unlocks its temp file
    only under that lock, just before renaming it away.
    """
    prefixes = (f".{name}{_TEMP}", f".{name}{MANIFEST_SUFFIX}{_TEMP}")
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


def fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_back(fs: Any, path: str, sha: str, size: int, shown: str) -> None:
    """Compare the destination's size and streamed sha256 with the local file's."""
    fs.invalidate_cache(path)
    found_size = fs.size(path)
    found_sha = sha256_of(fs, path) if found_size == size else "(not read: size differs)"
    if found_size != size or found_sha != sha:
        fs.rm_file(path)
        raise ChecksumError(
            f"read-back of {shown!r} does not match the local file: expected sha256 {sha} and "
            f"{size} bytes, found {found_sha} and {found_size} bytes; the object was deleted, "
            "publish again",
            [
                f"sha256 expected={sha} actual={found_sha}",
                f"bytes expected={size} actual={found_size}",
            ],
        )
