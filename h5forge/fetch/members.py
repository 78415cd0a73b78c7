"""Writing checked archive members below an extraction root, with the caps enforced.

:class:`MemberWriter` is what :func:`h5forge.fetch.extract.safe_extract` hands each member to,
whatever the container (tar or zip): it checks the member's name (:mod:`h5forge.paths`), where
links already on disk would make it land, the member count and the bytes actually written,
then creates folders one by one, files exclusively (never through a link), symbolic links that
resolve inside the root, and hard links as copies. Every refusal is an
:class:`~h5forge.errors.UnsafeArchiveError` naming the archive and the member, escaped.
"""

from __future__ import annotations

import errno
import lzma
import os
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from h5forge.errors import UnsafeArchiveError
from h5forge.messages import STORAGE_ERRNOS
from h5forge.paths import (
    MAX_DEPTH,
    MAX_LINKS,
    is_absolute_name,
    is_within,
    resolve,
    split_member_name,
)
from h5forge.text import printable

__all__ = ["MemberWriter"]

_CHUNK = 1 << 20
# Errors a corrupt or truncated archive raises while being read.
_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError)


class MemberWriter:
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
        self.current: Path = root  # what is being written: named if the storage fails

    def error(self, member: str, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(
            f"unsafe archive '{printable(self.archive)}': member '{printable(member)}' {why}"
        )

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
        # Resolving follows any link already on disk: a parent that is (or passes through) a
        # symlink must still land inside the root, and not deeper than the cap, before we
        # create or write anything.
        real_parent = self.resolve(member, "/".join(parts[:-1]))
        if not is_within(self.root_real, real_parent):
            raise self.error(member, "would be written through a link that leaves the archive")
        depth = real_parent[len(self.root_real) :].count(os.sep) + 1
        if depth > MAX_DEPTH:
            raise self.error(
                member,
                f"lands {depth} levels deep through in-archive links, over "
                f"the limit of {MAX_DEPTH} (a deep-tree attack?)",
            )
        with self.clash(member):
            self.make_parents(parts)
            if path.is_symlink() or path.is_file():
                path.unlink()  # a later member replaces an earlier one, never writes through it
        return path

    def make_parents(self, parts: tuple[str, ...]) -> None:
        """Create the folders above ``root/parts`` one by one (``mkdir(parents=True)`` recurses)."""
        folder = self.root
        for part in parts[:-1]:
            folder = folder / part
            self.current = folder
            try:
                os.mkdir(folder)
            except FileExistsError:
                if not folder.is_dir():  # a file (or a link to one) where a folder must go
                    raise NotADirectoryError(errno.ENOTDIR, "Not a directory") from None

    def resolve(self, member: str, rel: str) -> str:
        """The real path of ``rel`` (relative to the root), or an error naming ``member``."""
        try:
            return resolve(rel, base=self.root_real)
        except ValueError:
            raise self.error(
                member, f"passes more than {MAX_LINKS} symbolic links (a link loop or chain)"
            ) from None

    def mkdir(self, member: str) -> None:
        path = self.target(member)
        if path is not None:
            self.current = path
            with self.clash(member):
                path.mkdir(exist_ok=True)

    def write(self, member: str, src: IO[bytes], claimed: int) -> None:
        if self.written + claimed > self.max_bytes:
            raise self.error(member, self._bomb(self.written + claimed, "declares"))
        path = self.target(member)
        if path is None:
            raise self.error(member, "is a file named like the archive root")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        self.current = path
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
            raise self.error(member, f"is a symlink to absolute path '{printable(link)}'")
        path = self.target(member)
        if path is None:
            raise self.error(member, "is a symlink named like the archive root")
        self._check_link(member, path, link)
        self.current = path
        os.symlink(link, path)
        self.symlinks.append((member, path))

    def hardlink(self, member: str, link: str) -> None:
        parts = split_member_name(link)
        shown = f"'{printable(link)}'"
        if isinstance(parts, str) or not parts:
            raise self.error(member, f"is a hard link to {shown}, which {parts or 'is empty'}")
        source = self.resolve(member, "/".join(parts))
        if not is_within(self.root_real, source):
            raise self.error(member, f"is a hard link to {shown} outside the archive")
        if not os.path.isfile(source):
            raise self.error(member, f"is a hard link to {shown}, not an extracted file")
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
        # Not normalised: "a/../x" must resolve "a" first, as the kernel will (a may be a link).
        rel = f"{path.parent.relative_to(self.root).as_posix()}/{link}"
        resolved = self.resolve(member, rel)
        if not is_within(self.root_real, resolved):
            raise self.error(member, f"is a symlink to '{printable(link)}', which resolves outside")

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
        except OSError as exc:
            if exc.errno in STORAGE_ERRNOS:
                raise  # the storage failed, not the archive: safe_extract names it
            raise self.error(
                member, f"cannot be read, archive corrupt or truncated: {printable(exc)}"
            ) from exc
        except _CORRUPT as exc:
            raise self.error(
                member, f"cannot be read, archive corrupt or truncated: {printable(exc)}"
            ) from exc
