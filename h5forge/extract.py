"""Safe extraction of tar and zip archives from untrusted sources.

Every member is checked by our own code before a byte is written: names must be relative with
no ``..``; symbolic links must resolve inside the extraction folder (checked when created and
again once everything is written, because a later member can change where an earlier link
points); hard links are copied from a regular file already extracted; device, fifo and other
special members are refused; member count and the bytes actually written (not the sizes the
headers claim) are capped. Python's ``tarfile.data_filter`` runs as a second line of defence.
Extraction happens in ``DEST.staging-<random>`` next to ``dest``, renamed into place only when
complete; any failure removes the staging folder, so nothing is left behind.
"""

from __future__ import annotations

import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal

from h5forge._staging import (
    commit,
    discard,
    is_absolute_name,
    is_within,
    new_staging,
    split_member_name,
)
from h5forge.errors import UnsafeArchiveError

__all__ = ["ARCHIVE_FORMATS", "detect_archive", "safe_extract"]

ARCHIVE_FORMATS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")

_CHUNK = 1 << 20
_MAX_LINK_TARGET = 4096
# Errors a corrupt or truncated archive raises while being read.
_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError)


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


class _Writer:
    """Writes checked members below ``root`` and enforces the caps."""

    def __init__(self, archive: str, root: Path, max_members: int, max_bytes: int) -> None:
        self.archive = archive
        self.root = root
        self.root_real = os.path.realpath(root)
        self.max_members = max_members
        self.max_bytes = max_bytes
        self.members = 0
        self.written = 0
        self.symlinks: list[tuple[str, Path]] = []

    def error(self, member: str, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"unsafe archive {self.archive!r}: member {member!r} {why}")

    def count(self, member: str) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise self.error(
                member,
                f"exceeds max_members={self.max_members} (member-count bomb?); "
                "raise max_members if the archive is trusted",
            )

    def target(self, member: str) -> Path | None:
        """The checked output path of ``member`` with its parent folders created."""
        parts = split_member_name(member)
        if isinstance(parts, str):
            raise self.error(member, parts)
        if not parts:
            return None
        path = self.root.joinpath(*parts)
        # realpath follows any link already on disk: a parent that is (or passes through) a
        # symlink must still land inside the root before we create or write anything.
        if not is_within(self.root_real, os.path.realpath(path.parent)):
            raise self.error(member, "would be written through a link that leaves the archive")
        with self.clash(member):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink() or path.is_file():
                path.unlink()  # a later member replaces an earlier one, never writes through it
        return path

    def mkdir(self, member: str) -> None:
        path = self.target(member)
        if path is not None:
            with self.clash(member):
                path.mkdir(exist_ok=True)

    def write(self, member: str, src: IO[bytes], claimed: int) -> None:
        if self.written + claimed > self.max_bytes:
            raise self.error(member, self._bomb(self.written + claimed, "declares"))
        path = self.target(member)
        if path is None:
            raise self.error(member, "is a file named like the archive root")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with self.clash(member):
            fd = os.open(path, flags, 0o644)
        with os.fdopen(fd, "wb") as out:
            while True:
                with self.reading(member):
                    block = src.read(_CHUNK)
                if not block:
                    break
                self.written += len(block)
                if self.written > self.max_bytes:  # headers can lie: count what arrives
                    raise self.error(member, self._bomb(self.written, "expands to"))
                out.write(block)

    def symlink(self, member: str, link: str) -> None:
        if not link or "\x00" in link:
            raise self.error(member, "is a symlink with an empty or invalid target")
        if is_absolute_name(link):
            raise self.error(member, f"is a symlink to absolute path {link!r}")
        path = self.target(member)
        if path is None:
            raise self.error(member, "is a symlink named like the archive root")
        self._check_link(member, path, link)
        os.symlink(link, path)
        self.symlinks.append((member, path))

    def hardlink(self, member: str, link: str) -> None:
        parts = split_member_name(link)
        if isinstance(parts, str) or not parts:
            raise self.error(member, f"is a hard link to {link!r}, which {parts or 'is empty'}")
        source = os.path.realpath(self.root.joinpath(*parts))
        if not is_within(self.root_real, source):
            raise self.error(member, f"is a hard link to {link!r} outside the archive")
        if not os.path.isfile(source):
            raise self.error(member, f"is a hard link to {link!r}, not an extracted file")
        # Copy rather than link: the copy is counted against max_bytes and cannot alias a
        # file that a later member rewrites.
        with open(source, "rb") as src:
            self.write(member, src, os.path.getsize(source))

    def verify_links(self) -> None:
        """Re-check every symlink once all members exist (later members can re-aim them)."""
        for member, path in self.symlinks:
            if path.is_symlink():
                self._check_link(member, path, os.readlink(path))

    def _check_link(self, member: str, path: Path, link: str) -> None:
        resolved = os.path.realpath(os.path.join(path.parent, link))
        if not is_within(self.root_real, resolved):
            raise self.error(member, f"is a symlink to {link!r}, which resolves outside")

    def _bomb(self, total: int, verb: str) -> str:
        return (
            f"{verb} {total} bytes in total, over max_bytes={self.max_bytes} "
            "(decompression bomb?); raise max_bytes if the archive is trusted"
        )

    @contextmanager
    def clash(self, member: str) -> Iterator[None]:
        """Name collisions with earlier members (a file where a folder must go, ...)."""
        try:
            yield
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            raise self.error(member, f"clashes with an earlier member: {exc.strerror}") from exc

    @contextmanager
    def reading(self, member: str) -> Iterator[None]:
        try:
            yield
        except UnsafeArchiveError:
            raise
        except _CORRUPT as exc:
            raise self.error(
                member, f"cannot be read, archive corrupt or truncated: {exc}"
            ) from exc


def _extract_tar(archive: str, w: _Writer) -> None:
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


def _second_line(m: tarfile.TarInfo, w: _Writer) -> None:
    """Run ``tarfile.data_filter`` after our own checks passed; it only adds refusals."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # Python without PEP 706 backport
        return
    try:
        data_filter(m, str(w.root))
    except tarfile.FilterError as exc:
        raise w.error(m.name, f"is refused by tarfile.data_filter: {exc}") from exc


def _extract_zip(archive: str, w: _Writer) -> None:
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
        UnsafeArchiveError: a member is unsafe, over a cap, or unreadable; names the member.
        ValueError: an argument is invalid or the file is not a supported archive.
        FileExistsError: ``dest`` is not empty and ``replace`` is False.
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
    staging = new_staging(target)
    try:
        writer = _Writer(archive, staging, max_members, max_bytes)
        (_extract_zip if kind == "zip" else _extract_tar)(archive, writer)
        writer.verify_links()
        commit(staging, target, replace=replace)
    except BaseException:
        discard(staging)
        raise
    return str(target)
