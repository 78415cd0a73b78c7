"""Path safety for names h5forge did not choose: archive members, object keys, sample listing paths.

A name from someone else's archive, bucket or listing is split and checked before it becomes a
path (:func:`split_member_name`: relative, no ``..``, no NUL, bounded depth and length), and a
path that may pass through links planted by that someone is resolved without recursion
(:func:`resolve`, bounded by the kernel's own link limit) and checked to stay below its root
(:func:`is_within`). Fetch, extraction and discovery all use these, so one set of limits holds.
"""

from __future__ import annotations

import os
import re
import stat

from h5forge.text import printable

__all__ = [
    "MAX_COMPONENT_BYTES",
    "MAX_DEPTH",
    "MAX_LINKS",
    "MAX_NAME_BYTES",
    "is_absolute_name",
    "is_within",
    "resolve",
    "split_member_name",
]

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
