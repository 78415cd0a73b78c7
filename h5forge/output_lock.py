"""One writer per output (``OUT.lock`` beside it), and the files that writer made.

:func:`output_lock` holds the output's lock file (:func:`h5forge.locks.lock_file`, without
waiting: a second run refuses with a message naming the first) and records in it the inodes of
the files the run creates (:class:`OutputLock`), so the next run after a crash removes exactly
the files the dead run made (same inode), nothing that merely has their name.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

from h5forge.files import create_exclusive
from h5forge.locks import LOCK_SUFFIX, HeldLock, lock_file

__all__ = ["OutputLock", "output_lock"]


class OutputLock:
    """The lock of one output, held by this run, and the files this run created beside it.

    See :func:`output_lock`.

    Attributes:
        path: the lock file (``OUT.lock``).
        previous: the record a dead run left in it (its pid, host, files), or None.
    """

    def __init__(self, held: HeldLock) -> None:
        self.path, self.previous, self._held = held.path, held.previous, held
        self._made: list[tuple[str, os.stat_result]] = []
        self._write()

    def _write(self) -> None:
        self._held.record["files"] = [
            {"name": os.path.basename(p), "dev": st.st_dev, "ino": st.st_ino}
            for p, st in self._made
        ]
        self._held.write()

    def create(
        self, path: str | os.PathLike[str], mode: int = 0o600, *, flags: int = os.O_WRONLY
    ) -> int:
        """:func:`~h5forge.files.create_exclusive`, recorded as this run's (see :meth:`adopt`)."""
        fd = create_exclusive(path, mode, flags=flags)
        self.adopt(path, fd)
        return fd

    def adopt(self, path: str | os.PathLike[str], fd: int) -> os.stat_result:
        """Record that this run created ``path``, open as ``fd``, and return its identity.

        A later run that finds this record after a crash removes the file if the name is
        still that very inode, and :meth:`discard` removes it when this run fails.
        """
        st = os.fstat(fd)
        self._made.append((os.path.abspath(os.fspath(path)), st))
        self._write()
        return st

    def identity(self, path: str | os.PathLike[str]) -> os.stat_result:
        """The identity recorded for ``path`` by :meth:`adopt`."""
        want = os.path.abspath(os.fspath(path))
        for p, st in reversed(self._made):
            if p == want:
                return st
        raise KeyError(want)

    def forget(self, path: str | os.PathLike[str]) -> None:
        """Drop ``path`` from the record (it was renamed into place or removed)."""
        want = os.path.abspath(os.fspath(path))
        self._made = [(p, st) for p, st in self._made if p != want]
        self._write()

    def discard_one(self, path: str | os.PathLike[str]) -> None:
        """Remove one file this run created, if the name is still that inode; forget it."""
        want = os.path.abspath(os.fspath(path))
        for p, st in self._made:
            if p == want:
                _unlink_if(p, st.st_dev, st.st_ino)
        self.forget(path)

    def discard(self) -> None:
        """Remove every file this run created that still has its name (same inode)."""
        for path, st in self._made:
            _unlink_if(path, st.st_dev, st.st_ino)
        self._made = []
        self._write()

    def remove_leftovers(self) -> list[str]:
        """Remove the files the dead previous holder recorded, where each name is still that
        very inode (a regular file); return the paths removed. Anything else is kept."""
        removed: list[str] = []
        folder = os.path.dirname(self.path)
        for entry in (self.previous or {}).get("files", []):
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("name"), str)
                or os.sep in entry["name"]
                or entry["name"] in ("", ".", "..")
            ):
                continue
            path = os.path.join(folder, entry["name"])
            if _unlink_if(path, entry.get("dev"), entry.get("ino")):
                removed.append(path)
        return removed


def _unlink_if(path: str, dev: object, ino: object) -> bool:
    """Unlink ``path`` if it is a regular file with this device and inode number."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (dev, ino):
        os.unlink(path)
        return True
    return False


@contextlib.contextmanager
def output_lock(out: str | os.PathLike[str]) -> Iterator[OutputLock]:
    """Hold the lock of output ``out`` (``OUT.lock`` beside it) for one writer at a time.

    A second run refuses with a message naming the first; the record a killed run left tells
    the next one which files it made (see :meth:`OutputLock.remove_leftovers`). Where ``flock``
    does not exist (Windows) nothing is locked, and the files made are still tracked.

    Raises:
        BusyError: a live run holds it; the message names its pid and host, and what to do.
        UnsafePathError: the lock file is a symlink, a hard link, a folder or not a lock.
    """
    shown = os.fspath(out)
    with lock_file(os.path.abspath(shown) + LOCK_SUFFIX, wait=False, target=shown) as held:
        yield OutputLock(held)
