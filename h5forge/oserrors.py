"""Storage failures named as what they are: disk full, quota, read-only, permission denied.

An ``OSError`` raised while writing says ``[Errno 28] No space left on device`` and often no
path at all (``write`` has none). :func:`storage_error` turns the storage errors into one line
that names the condition, the path and the fix, keeping the built-in type (``OSError``,
``PermissionError``) and ``errno`` so callers can still tell them apart. Anything else (a
corrupt archive, a bug) is left alone: it is not the storage's fault and must not be dressed up
as if it were.
"""

from __future__ import annotations

import errno
import os

from h5forge.text import printable

__all__ = ["STORAGE_ERRNOS", "storage_error"]

# errno -> (what it is, what to do). EFBIG is what a file-size limit (ulimit -f, RLIMIT_FSIZE)
# gives once SIGXFSZ is ignored: the same "no more room" for the writer.
_KINDS = {
    errno.ENOSPC: ("disk full", "free space there or choose a destination on another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota or choose another "
                   "destination"),
    errno.EFBIG: ("file too large for this filesystem or for the process's file-size limit "
                  "(ulimit -f)", "raise the limit or choose another destination"),
    errno.EROFS: ("read-only filesystem", "choose a destination on a writable filesystem"),
    errno.EACCES: ("permission denied", "choose a folder you can write to or fix its "
                   "permissions"),
    errno.EPERM: ("operation not permitted", "choose a folder you can write to or fix its "
                  "permissions"),
}
STORAGE_ERRNOS: frozenset[int] = frozenset(_KINDS)


def storage_error(exc: OSError, path: str | os.PathLike[str] | None, *,
                  doing: str) -> OSError | None:
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
    kind = _KINDS.get(exc.errno) if exc.errno is not None else None
    if kind is None:
        return None
    what, fix = kind
    where = path if path is not None else exc.filename
    shown = f" at '{printable(where)}'" if where is not None else ""
    new = type(exc)(f"{what}{shown} while {doing}; {fix}")
    # Set after construction: with two arguments str() would print "[Errno N] ..." again.
    new.errno = exc.errno
    return new
