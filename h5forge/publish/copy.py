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
import errno
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
from h5forge.publish.sidecar import SIDECAR_SUFFIX

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

    Where the filesystem can (Linux ``O_TMPFILE``), the bytes are written to a file without a
    name, locked from its first instant, and linked in as the temp file only once complete and
    fsynced: a writer killed mid-copy leaves nothing in the folder. Elsewhere the file is created
    under a ``.new-`` name, locked, renamed to its temp name, then written.
    """
    parent, name = posixpath.split(path)
    token = secrets.token_hex(6)
    tmp = posixpath.join(parent, f".{name}{_TEMP}{token}")
    anonymous = _anonymous_file(parent)
    if anonymous is not None:
        out = os.fdopen(anonymous, "wb")
        fresh = None
    else:
        # Created under another name and locked before it gets its temp name, so a temp file
        # whose lock can be taken is always a dead writer's.
        fresh = posixpath.join(parent, f".{name}.new-{token}")
        # Exclusive: a name planted beside the destination (a symlink, a hard link) is refused.
        out = os.fdopen(create_exclusive(fresh, 0o644), "wb")
    try:
        flock(out.fileno())
        if fresh is not None:
            os.rename(fresh, tmp)
        src: IO[bytes]
        with open(local, "rb") if local else io.BytesIO(data or b"") as src:
            while block := src.read(CHUNK):
                out.write(block)
        out.flush()
        os.fsync(out.fileno())
        if fresh is None:
            _link_in(out.fileno(), tmp)
        yield TempFile(tmp, out)
    finally:
        out.close()
        for leftover in (fresh, tmp):
            if leftover is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)


def _link_in(fd: int, path: str) -> None:
    """Give the anonymous file open at ``fd`` the name ``path``, which must be new.

    ``linkat`` with ``AT_SYMLINK_FOLLOW`` on ``/proc/self/fd/N`` (a dir fd makes CPython call
    ``linkat`` rather than ``link``, which would link the magic link itself); it never follows
    or replaces ``path``: a planted name fails with EEXIST.
    """
    proc = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _anonymous_file(parent: str) -> int | None:
    """A new file without a name in ``parent`` (``O_TMPFILE``), or None where that is missing."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.open(parent or ".", flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None  # this filesystem (or kernel) has no O_TMPFILE
        raise
    return fd  # its mode is 0o644 less the umask, as for any new file


def remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp files of ``name`` (and of its sidecar) left by a killed publish.

    Call it under :func:`h5forge.locks.folder_lock`: a live publisher unlocks its temp file
    only under that lock, just before renaming it away.
    """
    prefixes = (f".{name}{_TEMP}", f".{name}{SIDECAR_SUFFIX}{_TEMP}")
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
