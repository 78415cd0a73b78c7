"""Safe extraction of tar and zip archives from untrusted sources.

Every member is checked by our own code before a byte is written: names must be relative with
no ``..``; symbolic links must resolve inside the extraction folder (checked when created and
again once everything is written, because a later member can change where an earlier link
points); hard links are copied from a regular file already extracted; device, fifo and other
special members are refused; member count and the bytes actually written (not the sizes the
headers claim) are capped. Python's ``tarfile.data_filter`` runs as a second line of defence.
Extraction happens in ``DEST.staging-<random>`` next to ``dest``, renamed into place only when
complete; any failure removes the staging folder, so nothing is left behind.

Depth is bounded too: a member nested more than :data:`MAX_DEPTH` levels, by its name or by
where in-archive links make it land, is refused before any of its folders is created, and a
chain of more than :data:`MAX_LINKS` symbolic links is refused as a loop. Nothing here recurses
by depth or by link count (folders are created and removed iteratively), so a hostile archive
cannot exhaust the interpreter's stack.

A storage failure while extracting (disk full, quota, read-only, permission denied) is not the
archive's fault: it is raised as the ``OSError`` it is, in one line naming the condition, the
path and the fix (:func:`h5forge.messages.storage_error`), never as ``UnsafeArchiveError``.
Names from the archive are shown escaped (:func:`h5forge.text.printable`) in every message.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Literal

from h5forge.fetch.members import MemberWriter
from h5forge.fetch.staging import commit, discard, new_staging
from h5forge.messages import storage_error
from h5forge.paths import MAX_DEPTH, MAX_LINKS
from h5forge.text import printable

__all__ = ["ARCHIVE_FORMATS", "MAX_DEPTH", "MAX_LINKS", "detect_archive", "safe_extract"]

ARCHIVE_FORMATS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")

_MAX_LINK_TARGET = 4096


def detect_archive(path: str | os.PathLike[str]) -> Literal["tar", "zip"] | None:
    """Detect an archive's container format from its content, not its name.

    Args:
        path: a local file.

    Returns:
        ``"tar"`` (plain, gzip, bzip2 or xz), ``"zip"``, or None when it is neither.
    """
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return "tar"
    if zipfile.is_zipfile(path):  # zip with a prefix, e.g. self-extracting
        return "zip"
    if tarfile.is_tarfile(path):  # pre-POSIX (v7) tar without the "ustar" magic
        return "tar"
    return None


def _extract_tar(archive: str, w: MemberWriter) -> None:
    with w.reading("<header>"), tarfile.open(archive, "r:*") as tf:
        while True:
            with w.reading("<next member>"):
                m = tf.next()
            if m is None:
                return
            # tarfile remembers every member it has read; we never look back (hard links are
            # copied from disk), so forget them and keep memory flat for huge archives.
            tf.members.clear()  # type: ignore[attr-defined]  # not in typeshed
            w.count(m.name)
            if m.isdir():
                w.mkdir(m.name)
            elif m.isreg():
                with w.reading(m.name):
                    src = tf.extractfile(m)
                assert src is not None  # isreg() members always have a file object
                w.write(m.name, src, m.size)
            elif m.issym():
                w.symlink(m.name, m.linkname)
            elif m.islnk():
                w.hardlink(m.name, m.linkname)
            else:
                raise w.error(m.name, "is a device, fifo or special file")
            _second_line(m, w)


def _second_line(m: tarfile.TarInfo, w: MemberWriter) -> None:
    """Run ``tarfile.data_filter`` after our own checks passed; it only adds refusals."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # Python without PEP 706 backport
        return
    try:
        data_filter(m, str(w.root))
    except tarfile.FilterError as exc:
        raise w.error(m.name, f"is refused by tarfile.data_filter: {exc}") from exc


def _extract_zip(archive: str, w: MemberWriter) -> None:
    with w.reading("<central directory>"), zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > w.max_members:
            w.members = w.max_members
            w.count(infos[w.max_members].filename)
        for info in infos:
            w.count(info.filename)
            mode = info.external_attr >> 16
            if info.flag_bits & 0x1:
                raise w.error(info.filename, "is encrypted")
            if stat.S_ISLNK(mode):
                if info.file_size > _MAX_LINK_TARGET:
                    raise w.error(info.filename, "is a symlink with an oversized target")
                with w.reading(info.filename):
                    link = zf.read(info).decode("utf-8", "surrogateescape")
                w.symlink(info.filename, link)
            elif stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise w.error(info.filename, "is a device, fifo or special file")
            elif info.is_dir():
                w.mkdir(info.filename)
            else:
                with w.reading(info.filename), zf.open(info) as src:
                    w.write(info.filename, src, info.file_size)


def safe_extract(
    archive: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    max_members: int = 1_000_000,
    max_bytes: int = 64 * 2**30,
    replace: bool = False,
) -> str:
    """Extract an untrusted archive into ``dest``, all or nothing.

    Args:
        archive: local ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz`` or ``.zip``
            file; the format is detected from the content.
        dest: folder to create. It must not exist, or be empty, unless ``replace`` is True.
        max_members: most members (files, folders, links) accepted.
        max_bytes: most bytes written in total, counted as they are decompressed.
        replace: replace an existing non-empty ``dest`` (renamed aside, then removed).

    Returns:
        The absolute path of ``dest``.

    Raises:
        UnsafeArchiveError: a member is unsafe, over a cap (including :data:`MAX_DEPTH` and
            :data:`MAX_LINKS`), or unreadable; names the member.
        ValueError: an argument is invalid or the file is not a supported archive.
        FileExistsError: ``dest`` is not empty and ``replace`` is False.
        OSError: the storage failed (disk full, quota, read-only, permission denied): one
            line naming it, the path and the fix; ``errno`` is kept. Nothing is left behind.
    """
    if max_members < 1 or max_bytes < 1:
        raise ValueError(f"max_members={max_members} and max_bytes={max_bytes} must both be >= 1")
    archive = os.fspath(archive)
    kind = detect_archive(archive)
    if kind is None:
        raise ValueError(
            f"{archive!r} is not a supported archive: expected one of "
            f"{', '.join(ARCHIVE_FORMATS)} (detected by content)"
        )
    target = Path(os.path.abspath(dest))
    if target.exists() and not replace and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(
            f"destination {str(target)!r} already exists and is not empty; "
            "remove it, choose a new folder, or pass replace=True"
        )
    doing = f"extracting '{printable(archive)}' into '{printable(target)}'"
    try:
        staging = new_staging(target)
    except OSError as exc:
        named = storage_error(exc, target.parent, doing=doing)
        if named is None:
            raise
        raise named from None
    writer = MemberWriter(archive, staging, max_members, max_bytes)
    try:
        (_extract_zip if kind == "zip" else _extract_tar)(archive, writer)
        writer.verify_links()
        writer.current = target
        commit(staging, target, replace=replace)
    except OSError as exc:
        discard(staging)  # first: a full disk gets its space back before anything else runs
        # Named as the user will know it: the staging folder is gone and was never theirs.
        shown = target / os.path.relpath(writer.current, staging)
        named = storage_error(exc, os.path.normpath(shown), doing=doing)
        if named is None:
            raise
        # The one line says all the OS said (condition, path); the chain would only repeat it.
        raise named from None
    except BaseException:
        discard(staging)
        raise
    return str(target)
