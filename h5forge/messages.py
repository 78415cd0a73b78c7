"""Operating-system errors in words: disk full, read-only, permission denied... with the path.

Python's ``str(OSError)`` reads ``[Errno 28] No space left on device: '/data/x.h5'``; HDF5's
reads ``Unable to synchronously create file (... errno = 30, error message = 'Read-only file
system' ...)``. :func:`describe_os_error` turns both into one sentence that names the cause,
the path and the fix; every command of the command line reports an ``OSError`` through it, and
:func:`os_error_in` finds the disk-full or read-only error behind an error that wraps one.
:func:`storage_error` does the same for code that re-raises (extraction): an error of the same
built-in type and ``errno`` whose text is that one line. One table below words every cause.
"""

from __future__ import annotations

import errno
import os
import re

from h5forge.text import printable

__all__ = ["STORAGE_ERRNOS", "describe_os_error", "os_error_in", "reworded", "storage_error"]

# errno -> (the cause in words, the fix). EFBIG is what a file-size limit (ulimit -f,
# RLIMIT_FSIZE) gives once SIGXFSZ is ignored: the same "no more room" for the writer.
_WORDS = {
    errno.ENOSPC: ("disk full", "free space there or choose a destination on another disk"),
    errno.EDQUOT: (
        "disk quota exceeded",
        "free space within your quota or choose another destination",
    ),
    errno.EFBIG: (
        "file too large for this file system or for the process's file-size limit (ulimit -f)",
        "raise the limit or choose another destination",
    ),
    errno.EROFS: ("read-only file system", "choose a writable destination"),
    errno.EACCES: ("permission denied", "choose a folder you can write to or fix its permissions"),
    errno.EPERM: (
        "operation not permitted",
        "choose a folder you can write to or fix its permissions",
    ),
}
STORAGE_ERRNOS: frozenset[int] = frozenset(_WORDS)

# HDF5 puts the C errno and the file name into its message text.
_H5_ERRNO = re.compile(r"errno = (\d+)")
_H5_NAME = re.compile(r"name = '([^']*)'")


def _cause(code: int | None, path: str, overwrite_flag: str) -> str | None:
    where = printable(path) if path else "the destination"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device of {where} ({_WORDS[code][0]}); {_WORDS[code][1]}"
    if code == errno.EROFS:
        return f"{where} is on a {_WORDS[code][0]}; {_WORDS[code][1]}"
    if code in (errno.EACCES, errno.EPERM, errno.EFBIG):
        return f"{_WORDS[code][0]} for {where}; {_WORDS[code][1]}"
    if code == errno.EEXIST:
        return f"{where} exists; pass {overwrite_flag} to replace it"
    if code == errno.ENOENT:
        return f"{where} does not exist"
    if code == errno.ENOTDIR:
        return f"a part of {where} is not a folder"
    if code == errno.EISDIR:
        return f"{where} is a folder, not a file"
    if code == errno.ELOOP:
        return f"{where} is a symbolic link, which h5forge does not follow"
    return None


def describe_os_error(
    e: OSError, *, path: str | None = None, overwrite_flag: str = "overwrite=True"
) -> str:
    """One sentence for ``e``: the cause in words, the path, and the fix; no ``[Errno N]``.

    Args:
        e: the error (Python's or h5py's).
        path: the path to name when ``e`` carries none (e.g. the output of the command).
        overwrite_flag: how to ask for replacing an existing file: ``overwrite=True`` for
            Python callers, ``--overwrite`` on the command line.
    """
    if e.strerror is None and not _H5_ERRNO.search(str(e)):
        return printable(str(e), limit=None)  # already worded by h5forge
    code = e.errno
    name = e.filename if e.filename is not None else None
    if code is None and (found := _H5_ERRNO.search(str(e))):
        code = int(found.group(1))
        named = _H5_NAME.search(str(e))
        name = named.group(1) if named else None
    shown = str(name) if name is not None else (path or "")
    worded = _cause(code, shown, overwrite_flag)
    if worded is not None:
        return worded
    reason = (e.strerror or str(e)).rstrip(".")
    return f"{printable(shown)}: {reason[:1].lower()}{reason[1:]}" if shown else reason


def os_error_in(e: BaseException) -> OSError | None:
    """The disk-full, read-only or permission error in ``e``'s cause chain, if any."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            code = current.errno
            if code is None and (found := _H5_ERRNO.search(str(current))):
                code = int(found.group(1))
            if code in STORAGE_ERRNOS:  # the fix is on the machine, not in the input
                return current
        current = current.__cause__ or current.__context__
    return None


def reworded(e: OSError, message: str) -> OSError:
    """An error of ``e``'s type and errno whose ``str`` is ``message`` (no errno prefix)."""
    new = type(e)(message)
    new.errno = e.errno
    return new


def storage_error(
    exc: OSError, path: str | os.PathLike[str] | None, *, doing: str
) -> OSError | None:
    """Return a one-line error naming a storage failure, or None when ``exc`` is not one.

    Args:
        exc: the error raised by the OS.
        path: the file or folder to name, as the user knows it (a temporary name means
            nothing to them); None names ``exc.filename``, when the OS gave one.
        doing: what was being done, e.g. ``"extracting 'data.tar' into '/data/x'"``.

    Returns:
        An error of the same built-in type as ``exc`` (``OSError``, ``PermissionError``) with
        the same ``errno``, whose ``str()`` is a single line without the raw errno text; or
        None when ``exc.errno`` is not in :data:`STORAGE_ERRNOS`.
    """
    words = _WORDS.get(exc.errno) if exc.errno is not None else None
    if words is None:
        return None
    where = path if path is not None else exc.filename
    shown = f" at '{printable(os.fspath(where))}'" if where is not None else ""
    return reworded(exc, f"{words[0]}{shown} while {doing}; {words[1]}")
