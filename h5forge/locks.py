"""Turn-taking between h5forge runs: one ``flock`` primitive and what it locks.

Every lock h5forge takes is an ``flock`` (:func:`flock`). The kernel drops it when its holder
dies, so a killed run never blocks the next one, and a lock that can be taken proves that
whoever held it is gone: that is how leftovers of dead runs are told from live work. It locks:

- a lock file beside a target (``DEST.lock`` of a fetch destination, ``OUT.lock`` of an output;
  :func:`lock_file`): created if missing, never through a link, a hard link or a name that is
  not a lock file of this user; it records its holder (pid, host, random token) and is removed
  on release. :func:`h5forge.output_lock.output_lock` adds the inodes of the files the holder
  creates, so the next run after a crash removes exactly those, nothing that merely has their
  name;
- a folder itself (:func:`folder_lock`): publishers into one folder take turns; a build's work
  folder is held for its run's life (:mod:`h5forge.workdir`);
- a file being written (a publish temp): held by its writer, so one whose lock can be taken was
  left by a dead writer.

Where ``flock`` does not exist (Windows) nothing is locked and nothing is taken for a dead
run's leftover.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from h5forge.documents import parse_json
from h5forge.errors import BusyError, UnsafePathError
from h5forge.files import (
    CLOEXEC,
    NOFOLLOW,
    NONBLOCK,
    describe,
    read_small,
    record,
    same_file,
)
from h5forge.platforms import require_calls

__all__ = [
    "LOCK_FORMAT",
    "LOCK_SUFFIX",
    "HeldLock",
    "flock",
    "folder_lock",
    "lock_file",
    "open_folder",
]

LOCK_SUFFIX = ".lock"
LOCK_FORMAT = "h5forge-lock/1"
# Opens of a lock file found removed by its releasing holder before one is kept (each such
# removal means another run took and released the lock meanwhile).
_REOPENS = 1000


def flock(fd: int, *, wait: bool = True) -> bool:
    """Take an exclusive ``flock`` on ``fd``; False when ``wait`` is False and someone else
    holds it. Where ``flock`` does not exist (Windows) it raises rather than take no turns."""
    require_calls("a lock that keeps two writers apart", "fcntl.flock")
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def open_folder(folder: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A read-only descriptor of the folder ``folder`` (a symlink refused unless ``follow``)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | CLOEXEC
    return os.open(folder, flags | (0 if follow else NOFOLLOW))


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive flock on ``folder`` itself, waiting for it (writers into it take turns).

    The folder is the caller's and may be reached through a symlink.
    """
    fd = open_folder(folder)
    try:
        flock(fd)
        yield
    finally:
        os.close(fd)


@dataclass
class HeldLock:
    """A lock file held by this run (see :func:`lock_file`).

    Attributes:
        path: the lock file.
        fd: its descriptor; None where nothing is locked (no ``flock``).
        record: what it records about this run (format, pid, host, token, time ...).
        previous: the record a dead holder left in it, or None.
    """

    path: str
    fd: int | None
    record: dict[str, Any]
    previous: dict[str, Any] | None

    def write(self) -> None:
        """Write :attr:`record` into the lock file (replacing what it held)."""
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(self.record).encode(), 0)


@contextlib.contextmanager
def lock_file(
    lock: str | os.PathLike[str], *, wait: bool = True, target: str | None = None
) -> Iterator[HeldLock]:
    """Hold the lock file ``lock`` (one holder at a time), recording this run in it.

    The lock file is removed on release while still held: a run that opened it meanwhile finds
    it gone and locks the new one instead.

    Args:
        lock: the lock file (``TARGET.lock``).
        wait: wait for a live holder to finish; else raise :class:`BusyError`.
        target: what the lock guards, as the busy message names it (default: ``lock``).

    Raises:
        BusyError: ``wait`` is False and a live run holds it; the message names its pid and
            host, and what to do.
        UnsafePathError: the lock file is a symlink, a hard link, a folder or not a lock.
    """
    path = os.path.abspath(os.fspath(lock))
    require_calls("a lock that keeps two writers apart", "fcntl.flock")
    while True:
        fd = _open_lock(path)
        if not flock(fd, wait=wait):
            error = _busy(target or path, path, fd)
            os.close(fd)
            raise error from None
        try:
            if same_file(os.fstat(fd), os.lstat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before us removed that file: lock the new one
    try:
        held = HeldLock(path, fd, record("lock", LOCK_FORMAT), _lock_record(fd, path))
        held.write()
    except BaseException:
        os.close(fd)
        raise
    try:
        yield held
    finally:
        with contextlib.suppress(FileNotFoundError):
            if same_file(os.fstat(fd), os.lstat(path)):
                os.unlink(path)
        os.close(fd)


def _lock_record(fd: int, lock: str) -> dict[str, Any] | None:
    """The record in a lock file: None when empty.

    Raises:
        UnsafePathError: the file holds something that is not an h5forge lock record.
    """
    raw = read_small(fd)
    if raw == b"":
        return None
    try:
        data = parse_json(raw, what="lock record", name=str(lock)) if raw is not None else None
    except ValueError:
        data = None
    if not (isinstance(data, dict) and data.get("format") == LOCK_FORMAT):
        raise UnsafePathError(
            f"{lock} is not an h5forge lock file ({describe(lock)} that holds no lock record); "
            "h5forge will not overwrite it: remove it (or rename the output) and run again"
        )
    return data


def _open_lock(lock: str) -> int:
    for _ in range(_REOPENS):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | NOFOLLOW | NONBLOCK | CLOEXEC, 0o644)
        except OSError:
            if os.path.islink(lock) or os.path.isdir(lock):
                raise UnsafePathError(
                    f"lock file {lock} is {describe(lock)}; h5forge never follows a link or uses "
                    "a name it did not make: remove it and run again"
                ) from None
            raise
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 0:
            # Its holder released it (removing it) between our open and this check: open the
            # name again, as lock_file does when it finds the file gone after its flock.
            os.close(fd)
            continue
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_nlink != 1
            or (hasattr(os, "getuid") and st.st_uid != os.getuid())
        ):
            os.close(fd)
            raise UnsafePathError(
                f"lock file {lock} is {describe(lock)}, not a lock file h5forge made (a regular "
                "file of yours with one link); remove it and run again"
            )
        return fd
    raise BusyError(
        f"lock file {lock} was removed {_REOPENS} times as it was opened: other runs take and "
        "release it without pause; run again"
    )


def _busy(out: str, lock: str, fd: int) -> BusyError:
    other = None
    for _ in range(10):  # the holder writes its record right after taking the lock
        with contextlib.suppress(UnsafePathError):
            other = _lock_record(fd, lock)
        if other is not None:
            break
        time.sleep(0.05)
    other = other or {}
    pid, host = other.get("pid", "unknown"), other.get("host", "unknown host")
    return BusyError(
        f"{out} is being written by another h5forge run (pid {pid} on {host}, started "
        f"{other.get('created', 'just now')}); wait for it to finish, or stop it (kill {pid}) "
        f"and run again. If no such process is running, remove {lock}"
    )
