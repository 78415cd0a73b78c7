"""Operating-system errors in words: disk full, read-only, permission denied... with the path.

Python's ``str(OSError)`` reads ``[Errno 28] No space left on device: '/data/x.h5'``; HDF5's
reads ``Unable to synchronously create file (... errno = 30, error message = 'Read-only file
system' ...)``. :func:`describe_os_error` turns both into one sentence that names the cause,
the path and the fix; every command of the command line reports an ``OSError`` through it, and
:func:`os_error_in` finds the disk-full or read-only error behind an error that wraps one.
"""

from __future__ import annotations

import errno
import re

from h5forge.text import printable

__all__ = ["describe_os_error", "os_error_in", "reworded"]

# HDF5 puts the C errno and the file name into its message text.
_H5_ERRNO = re.compile(r"errno = (\d+)")
_H5_NAME = re.compile(r"name = '([^']*)'")
# Causes worth naming even when another error wraps them: the fix is on the machine, not in
# the input (free space, a writable folder).
_MACHINE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _cause(code: int | None, path: str, overwrite_flag: str) -> str | None:
    where = printable(path) if path else "the destination"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left on the device of {where} (disk full"
                f"{' or quota exceeded' if code == errno.EDQUOT else ''}); free space there or "
                "choose another destination")
    if code == errno.EROFS:
        return f"{where} is on a read-only file system; choose a writable destination"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied for {where}; choose a folder you can write, or fix its rights"
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


def describe_os_error(e: OSError, *, path: str | None = None,
                      overwrite_flag: str = "overwrite=True") -> str:
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
            if code in _MACHINE:
                return current
        current = current.__cause__ or current.__context__
    return None


def reworded(e: OSError, message: str) -> OSError:
    """An error of ``e``'s type and errno whose ``str`` is ``message`` (no errno prefix)."""
    new = type(e)(message)
    new.errno = e.errno
    return new
