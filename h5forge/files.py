"""How h5forge creates files and folders: exclusively, never through a link, and marked.

h5forge writes beside the user's files under predictable names (``OUT.partial``, a preview, a
publish temp, a staging folder, a work folder in TMPDIR), so whoever can write there could plant
a symlink or a hard link at such a name and have h5forge write through it, or make a folder with
such a name and have h5forge delete it. The rules, kept in this one module:

- A new file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: any existing name — a symlink
  (dangling or not), a hard link to another file, a leftover — is refused, never opened.
- A file that replaces another (a preview, a cache record) is written under a fresh exclusive
  name and renamed over its target: a rename replaces a link, it never writes through one.
- A scratch folder carries a marker file h5forge wrote (created exclusively; a format tag, a
  random token, the pid and host). Cleanup removes only folders holding a marker that is a
  regular file owned by this user, never a folder by its name alone, and removes them without
  following links inside and without recursion (:func:`remove_tree`).
- One writer per output: :func:`output_lock` takes an ``flock`` on ``OUT.lock`` beside it and
  records the run's pid and host and the inodes of the files it creates, so a second run refuses
  with a message naming the first, and the next run after a crash removes exactly the files the
  dead run made (same inode), nothing that merely has their name.

The folder a caller asks to write into is the caller's choice and may be reached through a
symlink; only the names h5forge invents inside it are protected.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from h5forge.errors import BusyError, UnsafePathError

__all__ = [
    "LOCK_SUFFIX",
    "MARKER_NAME",
    "OutputLock",
    "create_exclusive",
    "describe",
    "is_ours",
    "make_marked_dir",
    "mark",
    "output_lock",
    "remove_marked",
    "remove_tree",
    "replace_file",
    "same_file",
    "unmark",
]

MARKER_NAME = ".h5forge-marker"
LOCK_SUFFIX = ".lock"
_MARKER_FORMAT = "h5forge-marker/1"
_LOCK_FORMAT = "h5forge-lock/1"
_MAX_RECORD = 64 << 10  # a marker or lock record is a few hundred bytes; refuse anything big

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted at a name must not hang the open


def describe(path: str | os.PathLike[str]) -> str:
    """What occupies ``path``, in words, for messages ("a symbolic link to '/etc/passwd'")."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "nothing"
    except OSError as e:
        return f"something unreadable ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r}"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        kind = "a folder"
    elif stat.S_ISREG(st.st_mode):
        kind = f"a file of {st.st_size} bytes"
        if st.st_nlink > 1:
            kind += f" with {st.st_nlink} hard links"
    else:
        kind = "a special file (FIFO, socket or device)"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        kind += f" owned by uid {st.st_uid}"
    return kind


def create_exclusive(
    path: str | os.PathLike[str], mode: int = 0o600, *, flags: int = os.O_WRONLY
) -> int:
    """Create ``path`` as a new file and return its descriptor; never opens an existing name.

    ``O_EXCL`` makes the kernel refuse any existing name, a symlink included (even one that
    dangles), in the same step that creates the file, so there is no window between a check and
    the open; a hard link to another file is an existing name too.

    Args:
        path: the file to create.
        mode: permission bits (before the umask): 0o600 for private scratch, 0o644 for output.
        flags: access flags added to the creation flags (``os.O_WRONLY`` or ``os.O_RDWR``).

    Raises:
        UnsafePathError: something already has that name (the message says what).
    """
    p = os.fspath(path)
    try:
        return os.open(p, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    except FileExistsError:
        raise UnsafePathError(
            f"cannot create {p}: {describe(p)} already has that name; h5forge creates its "
            "files only under new names and never writes through an existing name or a link — "
            "remove it if it is a leftover of yours, or choose another output"
        ) from None


def replace_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` through a fresh exclusive temp name, fsync, rename over it.

    Whatever had the name (a file, a planted symlink) is replaced, never written through.
    """
    p = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(p))
    tmp = os.path.join(folder, f".{name}.tmp-{secrets.token_hex(6)}")
    fd = create_exclusive(tmp, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stat results are the same inode (device and inode number)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _record(kind: str) -> dict[str, Any]:
    return {
        "format": _MARKER_FORMAT if kind != "lock" else _LOCK_FORMAT,
        "kind": kind,
        "token": secrets.token_hex(8),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def mark(folder: str | os.PathLike[str], kind: str) -> None:
    """Write h5forge's marker (kind, random token, pid, host) into ``folder``, exclusively."""
    fd = create_exclusive(os.path.join(folder, MARKER_NAME), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(_record(kind)).encode())


def unmark(folder: str | os.PathLike[str]) -> None:
    """Remove the marker of ``folder`` (before it becomes the user's data)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, MARKER_NAME))


def make_marked_dir(path: str | os.PathLike[str], kind: str, mode: int = 0o777) -> Path:
    """Create the new folder ``path`` (``mkdir`` refuses an existing name, a link included) and
    mark it as h5forge's, so that :func:`remove_marked` may remove it later."""
    os.mkdir(path, mode)
    try:
        mark(path, kind)
    except BaseException:
        os.rmdir(path)
        raise
    return Path(path)


def _read_small(fd: int) -> bytes | None:
    st = os.fstat(fd)
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_size > _MAX_RECORD
        or (hasattr(os, "getuid") and st.st_uid != os.getuid())
    ):
        return None
    return os.pread(fd, _MAX_RECORD, 0)


def _marker(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker record of ``folder``, or None: not a real folder (a symlink is not), not this
    user's, or no marker that is a regular file of this user with h5forge's format tag."""
    try:
        dfd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError:  # gone, a symlink (ELOOP), not a folder, not ours to read
        return None
    try:
        if hasattr(os, "getuid") and os.fstat(dfd).st_uid != os.getuid():
            return None
        flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        # Relative to the folder just checked, so a folder swapped in meanwhile is not read.
        fd = (
            os.open(MARKER_NAME, flags, dir_fd=dfd)
            if os.open in os.supports_dir_fd
            else os.open(os.path.join(folder, MARKER_NAME), flags)
        )
        try:
            raw = _read_small(fd)
        finally:
            os.close(fd)
        data = json.loads(raw) if raw is not None else None
    except (OSError, ValueError):  # no marker, a symlinked marker (ELOOP), not JSON
        return None
    finally:
        os.close(dfd)
    return data if isinstance(data, dict) and data.get("format") == _MARKER_FORMAT else None


def is_ours(folder: str | os.PathLike[str], kind: str | None = None) -> bool:
    """Whether ``folder`` is a folder h5forge made (carries its marker), of ``kind`` if given."""
    found = _marker(folder)
    return found is not None and (kind is None or found.get("kind") == kind)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove the folder ``path`` and everything below it, without recursion or following links.

    One descriptor is open at a time; the way back up is ``..`` of the folder just emptied,
    checked to be the folder we came from (same device and inode), so a folder moved meanwhile
    stops the removal instead of redirecting it. Memory is proportional to the depth plus the
    subfolders not yet visited.
    """
    if not (os.supports_dir_fd >= {os.open, os.unlink, os.rmdir} and os.scandir in os.supports_fd):
        shutil.rmtree(path)  # no descriptor-relative calls here (Windows)
        return
    fd = os.open(path, _DIR_FLAGS)
    # One frame per open level: (identity of the folder, subfolder names left to visit, name
    # of this folder in its parent).
    stack: list[tuple[tuple[int, int], list[str], str]] = []
    name = ""
    try:
        while True:
            st = os.fstat(fd)
            subdirs = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
            stack.append(((st.st_dev, st.st_ino), subdirs, name))
            while stack and not stack[-1][1]:
                ident, _, done = stack.pop()
                if not stack:
                    os.close(fd)
                    fd = -1
                    os.rmdir(path)
                    return
                parent = os.open("..", _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
                os.close(fd)
                fd = parent
                pst = os.fstat(fd)
                if (pst.st_dev, pst.st_ino) != stack[-1][0]:
                    raise OSError(
                        f"folder {done!r} under {os.fspath(path)!r} was moved while "
                        "being removed; removal stopped"
                    )
                os.rmdir(done, dir_fd=fd)
            name = stack[-1][1].pop()
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        if fd >= 0:
            os.close(fd)


def remove_marked(folder: str | os.PathLike[str], kind: str | None = None) -> bool:
    """Remove ``folder`` if it carries h5forge's marker (of ``kind``); True when removed.

    Links inside are removed, never followed, and depth costs no recursion
    (:func:`remove_tree`); a folder without the marker — one the user made with a look-alike
    name — stays.
    """
    if not is_ours(folder, kind):
        return False
    remove_tree(folder)
    return True


class OutputLock:
    """The lock of one output, held by this run, and the files this run created beside it.

    See :func:`output_lock`.

    Attributes:
        path: the lock file (``OUT.lock``).
        previous: the record a dead run left in it (its pid, host, files), or None.
    """

    def __init__(self, path: str, fd: int | None, previous: dict[str, Any] | None) -> None:
        self.path, self._fd, self.previous = path, fd, previous
        self._record = _record("lock")
        self._made: list[tuple[str, os.stat_result]] = []
        self._write()

    def _write(self) -> None:
        if self._fd is None:
            return
        self._record["files"] = [
            {"name": os.path.basename(p), "dev": st.st_dev, "ino": st.st_ino}
            for p, st in self._made
        ]
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(self._record).encode(), 0)

    def create(
        self, path: str | os.PathLike[str], mode: int = 0o600, *, flags: int = os.O_WRONLY
    ) -> int:
        """:func:`create_exclusive`, recorded as this run's (see :meth:`adopt`)."""
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

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlinked while still held: a run that opened it meanwhile finds it gone and retries.
        with contextlib.suppress(FileNotFoundError):
            if same_file(os.fstat(self._fd), os.lstat(self.path)):
                os.unlink(self.path)
        os.close(self._fd)


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


def _lock_record(fd: int, lock: str) -> dict[str, Any] | None:
    """The record in a lock file: None when empty.

    Raises:
        UnsafePathError: the file holds something that is not an h5forge lock record.
    """
    raw = _read_small(fd)
    if raw == b"":
        return None
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        data = None
    if not (isinstance(data, dict) and data.get("format") == _LOCK_FORMAT):
        raise UnsafePathError(
            f"{lock} is not an h5forge lock file ({describe(lock)} that holds no lock record); "
            "h5forge will not overwrite it: remove it (or rename the output) and run again"
        )
    return data


def _open_lock(lock: str) -> int:
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644)
    except OSError:
        if os.path.islink(lock) or os.path.isdir(lock):
            raise UnsafePathError(
                f"lock file {lock} is {describe(lock)}; h5forge never follows a link or uses a "
                "name it did not make: remove it and run again"
            ) from None
        raise
    st = os.fstat(fd)
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


@contextlib.contextmanager
def output_lock(out: str | os.PathLike[str]) -> Iterator[OutputLock]:
    """Hold the lock of output ``out`` (``OUT.lock`` beside it) for one writer at a time.

    The lock is an ``flock``, which the kernel drops when its holder dies: a killed run never
    blocks the next one, and the record it left tells the next one which files it made (see
    :meth:`OutputLock.remove_leftovers`). Where ``flock`` does not exist (Windows) nothing is
    locked, and the files made are still tracked.

    Raises:
        BusyError: a live run holds it; the message names its pid and host, and what to do.
        UnsafePathError: the lock file is a symlink, a hard link, a folder or not a lock.
    """
    shown = os.fspath(out)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no turn-taking, files are still tracked
        held = OutputLock(os.path.abspath(shown) + LOCK_SUFFIX, None, None)
        yield held
        return
    lock = os.path.abspath(shown) + LOCK_SUFFIX
    while True:
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _busy(shown, lock, fd)
            os.close(fd)
            raise error from None
        try:
            if same_file(os.fstat(fd), os.lstat(lock)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before us removed that file: lock the new one
    try:
        held = OutputLock(lock, fd, _lock_record(fd, lock))
    except BaseException:
        os.close(fd)
        raise
    try:
        yield held
    finally:
        held.release()
