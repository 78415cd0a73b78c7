"""Private helpers shared by extraction and fetching: member-name checks and staging folders.

A staging folder is created next to its destination (same filesystem, so the final rename is
atomic), filled, then renamed into place. Anything that goes wrong removes the staging folder.
A process killed meanwhile cannot clean up: :func:`exclusive` serialises the writers of one
destination and removes what dead writers left beside it (``DEST.staging-*``,
``DEST.incoming-*``, ``DEST.old-*``), which are never taken as data. A leftover is recognised by
the marker h5forge writes into each of these folders (:mod:`h5forge.files`), never by its name
alone: a folder of the user's with a look-alike name stays. The marker is removed just before a
folder becomes the destination itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from h5forge.errors import UnsafePathError
from h5forge.files import describe, make_marked_dir, mark, remove_marked, remove_tree, unmark
from h5forge.text import printable

__all__: list[str] = []

log = logging.getLogger("h5forge.fetch.sources")

# Names of the temporary siblings of a destination folder (see new_staging, commit, fetch).
LEFTOVER_KINDS = ("staging", "incoming", "old")
_LEFTOVER_NAME = re.compile(r"\.(staging|incoming|old)-[0-9a-f]{12}$")
_MARK = "staging"  # the kind recorded in the marker of these folders

_DRIVE = re.compile(r"^[A-Za-z]:")


# Deepest member accepted (folders plus the file itself). Real datasets nest a few levels; a
# name thousands of folders deep only exists to exhaust something (recursion, PATH_MAX).
MAX_DEPTH = 64
# Kernel limits on Linux and macOS: one name component (NAME_MAX) and a whole path (PATH_MAX).
# A longer member cannot be written anyway; refusing it here names it instead of failing
# with ENAMETOOLONG halfway through.
MAX_COMPONENT_BYTES = 255
MAX_NAME_BYTES = 4096


def split_member_name(name: str) -> tuple[str, ...] | str:
    """Split an archive member or object key into safe relative path parts.

    Returns the parts (empty tuple for the root itself), or a string saying why the name is
    unsafe: absolute, a drive letter, a ``..`` component, a NUL byte, more than
    :data:`MAX_DEPTH` parts, or longer than the kernel's name limits. Backslashes count as
    separators so that a name that is harmless here cannot escape on Windows.
    """
    if "\x00" in name:
        return "contains a NUL byte"
    if is_absolute_name(name):
        return "is an absolute path"
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long, over the limit of {MAX_NAME_BYTES} (PATH_MAX)"
    parts = tuple(p for p in re.split(r"[/\\]", name) if p not in ("", "."))
    if ".." in parts:
        return "has a '..' component"
    if len(parts) > MAX_DEPTH:
        return (
            f"is nested {len(parts)} levels deep, over the limit of {MAX_DEPTH} "
            "(a deep-tree attack?)"
        )
    for part in parts:
        if len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes (NAME_MAX)"
    return parts


def is_absolute_name(name: str) -> bool:
    """Whether ``name`` is absolute here or on Windows (leading separator or drive letter)."""
    return name.startswith(("/", "\\")) or bool(_DRIVE.match(name))


# Most symbolic links followed while resolving one path: the kernel's own limit (MAXSYMLINKS
# is 40 on Linux), so nothing resolves here that open() would refuse with ELOOP.
MAX_LINKS = 40


def resolve(
    path: str | os.PathLike[str], *, base: str | None = None, max_links: int = MAX_LINKS
) -> str:
    """Return the real absolute path of ``path``, like ``os.path.realpath`` (non-strict).

    Iterative, unlike ``os.path.realpath`` before Python 3.13, which recurses once per link
    in a chain: an archive of 1,500 links each pointing at the next would raise
    ``RecursionError`` there. Components that do not exist are kept as written.

    Args:
        path: the path; relative to ``base`` when that is given, else to the working folder.
        base: an absolute path already resolved (a real path), so that its own components
            are not looked up again: one ``lstat`` per component of ``path`` only.
        max_links: most symbolic links followed.

    Raises:
        ValueError: resolving needs more than ``max_links`` links (a loop or a chain attack).
    """
    text = os.fspath(path)
    resolved = ""  # "" is the root folder
    if base is not None and not text.startswith("/"):
        resolved = base.rstrip("/")
    elif not text.startswith("/"):
        text = os.getcwd() + "/" + text
    pending = text.split("/")[::-1]  # a stack: the next component is last
    links = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            resolved = resolved.rpartition("/")[0]
            continue
        candidate = f"{resolved}/{part}"
        try:
            mode = os.lstat(candidate).st_mode
        except OSError:  # missing (or below a file): the rest is kept as written
            mode = 0
        if not stat.S_ISLNK(mode):
            resolved = candidate
            continue
        links += 1
        if links > max_links:
            raise ValueError(
                f"resolving '{printable(text)}' follows more than {max_links} "
                "symbolic links (a loop or a chain)"
            )
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = ""
        pending.extend(target.split("/")[::-1])
    return resolved or "/"


def is_within(root: str, path: str) -> bool:
    """Whether ``path`` (already resolved) is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def new_staging(dest: Path) -> Path:
    """Create and return a fresh staging folder next to ``dest``, holding only h5forge's marker
    (which :func:`commit` removes before the folder becomes ``dest``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return make_marked_dir(dest.with_name(f"{dest.name}.staging-{secrets.token_hex(6)}"), _MARK)


def discard(path: Path) -> None:
    """Remove a staging folder (symlinks inside are removed, never followed).

    Iterative and relative to directory descriptors, unlike ``shutil.rmtree`` (recursive before
    Python 3.12, and by path): a tree thousands of folders deep, or one whose real path is longer
    than PATH_MAX (folders created through in-tree links), is removed all the same.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        remove_tree(path)


def commit(staging: Path, dest: Path, *, replace: bool) -> None:
    """Rename ``staging`` to ``dest``.

    An empty ``dest`` folder is replaced silently. A non-empty one is replaced only with
    ``replace=True``: it is renamed aside first, so ``dest`` is never a mix of old and new.

    Raises:
        FileExistsError: ``dest`` exists, is not an empty folder, and ``replace`` is False.
    """
    if not _LEFTOVER_NAME.search(dest.name):  # the real destination, not a step towards it
        unmark(staging)
    if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
        dest.rmdir()
    if not (dest.exists() or dest.is_symlink()):
        os.rename(staging, dest)
        return
    if not replace:
        raise FileExistsError(
            f"destination {str(dest)!r} already exists and is not empty; "
            "remove it or choose a new folder"
        )
    old = dest.with_name(f"{dest.name}.old-{secrets.token_hex(6)}")
    os.rename(dest, old)
    with contextlib.suppress(OSError):  # unmarked (read-only?): a kill now leaves it, kept
        mark(old, _MARK)  # so that a run killed before discard() has it removed by the next
    os.rename(staging, dest)
    discard(old)


@contextmanager
def exclusive(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``dest`` (the file ``DEST.lock`` beside it) and clear leftovers.

    Writers of one destination take turns; once the lock is held nobody else is writing it,
    so every ``DEST.staging-*``, ``DEST.incoming-*`` and ``DEST.old-*`` sibling was left by a
    writer that died (killed, power loss) and is removed. The kernel releases the lock when its
    holder dies, so a killed run never blocks the next one; the lock file is removed on exit.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no turn-taking, leftovers stay
        yield
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = dest.with_name(f"{dest.name}.lock")
    while True:
        try:  # never through a link planted at the name
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError:
            if lock.is_symlink() or lock.is_dir():
                raise UnsafePathError(
                    f"lock file {lock} is {describe(lock)}; h5forge never follows a link or uses "
                    "a name it did not make: remove it and run again"
                ) from None
            raise
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed that file: lock the new one
    try:
        _remove_leftovers(dest)
        yield
    finally:
        os.unlink(lock)  # while still holding it: a waiter then finds a new file, see above
        os.close(fd)


def _remove_leftovers(dest: Path) -> None:
    prefixes = tuple(f"{dest.name}.{kind}-" for kind in LEFTOVER_KINDS)
    with os.scandir(dest.parent) as entries:
        stale = [Path(e.path) for e in entries if e.name.startswith(prefixes)]
    for path in stale:
        # Only what carries h5forge's marker; a look-alike folder of the user's stays.
        if remove_marked(path, _MARK):
            log.info("removed %s, left by an interrupted fetch", path)
        else:
            log.info("kept %s: named like a leftover, but h5forge did not make it", path)
