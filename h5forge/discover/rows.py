"""Checks of listing rows: integer labels bounded, every path inside the folder, a regular file.

:func:`check_label_range` bounds integer labels by the number of rows, so the classes made from
them never depend on a label's value. :func:`check_path` and :func:`check_file` keep every
listed path inside the listing's folder, symbolic links included (their real target is
checked), and refuse anything that is not a regular file without opening it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from h5forge.discover.listing import LABEL_FLOOR, MAX_PATH_BYTES, ListingRow
from h5forge.files import file_kind
from h5forge.paths import MAX_LINKS, is_within, resolve
from h5forge.text import printable

__all__ = ["check_file", "check_label_range", "check_path"]


def check_label_range(shown: str, rows: list[ListingRow]) -> None:
    """Refuse an integer label at or above ``max(len(rows), LABEL_FLOOR)``.

    Integer labels name classes ``0..max``: bound ``max`` by what the rows can justify.

    ``max + 1`` class names are made, so a label of 2**40 would allocate for 2**40 names. A
    listing of R rows uses at most R classes; up to :data:`LABEL_FLOOR` is allowed whatever
    the row count, so a small listing can keep the indices of a 1,000-class dataset.
    """
    bound = max(len(rows), LABEL_FLOOR)
    for line, _, label, *_ in rows:
        if isinstance(label, int) and label >= bound:
            raise ValueError(
                f"{shown}:{line}: label {printable(label, limit=40)} is out of range: a listing "
                f"of {len(rows):,} rows may use integer labels 0..{bound - 1:,} (at most one "
                f"class per row, or {LABEL_FLOOR:,} for a small listing); number the classes "
                "from 0, or give class names instead of numbers"
            )


def check_path(where: str, rel: str, *, folder: str = "the listing's folder") -> str:
    """Return the normalised POSIX form of a listing path (``folder``: what it is relative to,
    in words, for the messages).

    Raises:
        ValueError: ``rel`` is empty, holds a NUL byte, is over :data:`MAX_PATH_BYTES`, is
            absolute or leaves the folder lexically; ``where`` (``FILE:LINE``) starts the message.
    """
    if not rel:
        raise ValueError(f"{where}: empty path; give the image's path relative to {folder}")
    if "\x00" in rel:
        raise ValueError(f"{where}: path '{printable(rel)}' contains a NUL byte")
    size = len(rel.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise ValueError(
            f"{where}: path '{printable(rel)}' is {size:,} bytes, over the limit of "
            f"{MAX_PATH_BYTES:,} (PATH_MAX)"
        )
    norm = os.path.normpath(rel).replace(os.sep, "/")
    if os.path.isabs(rel) or norm == ".." or norm.startswith("../"):
        raise ValueError(
            f"{where}: path '{printable(rel)}' must be relative to {folder} and stay inside it"
        )
    return norm


def check_file(
    where: str,
    rel: str,
    norm: str,
    full: Path,
    folder_real: str,
    folders: dict[str, str],
    *,
    folder: str = "the listing's folder",
) -> None:
    """Check that ``full`` is a regular file whose real path (links resolved) is in the folder.

    Args:
        where: ``FILE:LINE``, the start of every message.
        rel: the path as the listing wrote it (shown, escaped, in messages).
        norm: its normalised form (from :func:`check_path`); ``full`` is the folder / ``norm``.
        full: the path to check.
        folder_real: the listing folder's real path.
        folders: a cache of the real path of each parent folder seen, shared across rows, so
            a plain file costs one ``lstat``.
        folder: the folder in words, for the messages.

    Raises:
        ValueError: the real path leaves the folder, needs more than :data:`MAX_LINKS` links,
            or is not a regular file (FIFO, device, folder: found by ``stat``, never opened).
        FileNotFoundError: nothing is there.
    """
    parent, _, leaf = norm.rpartition("/")
    try:
        parent_real = folders.get(parent)
        if parent_real is None:
            parent_real = folders[parent] = resolve(parent, base=folder_real)
        real = f"{parent_real}/{leaf}"
        try:
            st = os.lstat(real)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            real = resolve(leaf, base=parent_real)
            st = None
    except ValueError:
        raise ValueError(
            f"{where}: path '{printable(rel)}' passes more than {MAX_LINKS} symbolic "
            "links (a loop?)"
        ) from None
    if not is_within(folder_real, real):
        raise ValueError(
            f"{where}: path '{printable(rel)}' is a symbolic link (or passes through one) to "
            f"'{printable(real)}', outside {folder} '{printable(folder_real)}'; "
            "copy the file in, or put the listing in a folder that holds both"
        )
    try:
        st = st or os.stat(real)  # stat, never open: opening a FIFO would block
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(
            f"{where}: file '{printable(rel)}' not found (looked for '{printable(full)}')"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{where}: path '{printable(rel)}' is {file_kind(st.st_mode)}, not a "
            "regular file; list image files only"
        )
