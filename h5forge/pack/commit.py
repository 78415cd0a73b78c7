"""The local commit protocol of a new h5forge file: stage, verify, seal, fsync, rename.

A pack (:func:`h5forge.pack.writer.pack`) and a merge (:func:`h5forge.scale.merge.merge_parts`)
both write ``OUT.partial`` and commit it the same way, here:

1. :func:`check_output` refuses a bad output name, or an existing ``OUT`` without
   ``overwrite``, before any work, and again once the lock is held;
2. :func:`staged` holds ``OUT.lock`` (:func:`h5forge.files.output_lock`: one run per output),
   removes what a killed run recorded making, and hands out a :class:`Staged` whose
   :meth:`Staged.create` makes ``OUT.partial`` exclusively (a planted symlink or hard link at
   that name is refused, never written through);
3. when the body returns, the file's metadata is digested, it is verified while it is fsynced,
   the ``sealed`` attribute is set last, it is fsynced again, checked to be still the inode
   this run created, renamed to ``OUT``, and the folder is fsynced. An exception instead
   leaves nothing named ``OUT``; this run's partial files are removed either way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import h5py

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.errors import UnsafePathError
from h5forge.files import describe, same_file
from h5forge.output_lock import OutputLock, output_lock

__all__ = ["Staged", "check_output", "staged"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def check_output(out: str | os.PathLike[str], overwrite: bool, how: str = "") -> Path:
    """The output path of a pack or merge, after checking it may be written.

    Args:
        how: how the caller asks for an overwrite, for the message (``"(CLI: --overwrite) "``).

    Raises:
        ValueError: ``out`` ends in ``.partial``.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    out_path = Path(out)
    if out_path.suffix == fmt.PARTIAL_SUFFIX:
        raise ValueError(f"output {out} must not end in {fmt.PARTIAL_SUFFIX}")
    if out_path.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True {how}to replace it")
    return out_path


@dataclass(frozen=True)
class Staged:
    """The ``.partial`` of an output being written, and the lock that records what it made.

    Attributes:
        partial: ``OUT.partial``, the name the file is written under.
        lock: the held ``OUT.lock``; files created through it are this run's to remove.
    """

    partial: str
    lock: OutputLock

    def create(self) -> h5py.File:
        """Create the HDF5 file :attr:`partial` exclusively (HDF5's ``H5F_ACC_EXCL``:
        ``O_CREAT|O_EXCL``, which refuses any existing name, a symlink included) and record it
        as this run's.

        Raises:
            UnsafePathError: something h5forge did not make already has the name.
        """
        path = self.partial
        try:
            h5 = h5py.File(path, "x")
        except FileExistsError:
            raise UnsafePathError(
                f"cannot create {path}: {describe(path)} already has that name and no h5forge "
                "run recorded making it; h5forge never writes through an existing name or a "
                "link — remove it if it is a leftover of yours, or choose another output"
            ) from None
        try:
            self.lock.adopt(path, h5.id.get_vfd_handle())
        except BaseException:
            h5.close()
            raise
        return h5

    def open_own(self, mode: str = "r+") -> h5py.File:
        """Reopen :attr:`partial`, checking it is still the very inode this run created.

        Raises:
            UnsafePathError: the name now leads to another file (swapped for a link meanwhile).
        """
        h5 = h5py.File(self.partial, mode)
        try:
            if not same_file(os.fstat(h5.id.get_vfd_handle()), self.lock.identity(self.partial)):
                raise UnsafePathError(
                    f"{self.partial} is no longer the file this run created (replaced, or "
                    "swapped for a link, while the pack ran); nothing was written to it — find "
                    "out who writes into this folder, then pack again"
                )
        except BaseException:
            h5.close()
            raise
        return h5

    def seal(self, out_path: Path, *, max_pixels: int, check_digests: bool = True) -> None:
        """Digest the metadata, verify, seal (attribute last), fsync, rename to ``out_path``.

        ``max_pixels`` is the writer's own decode bound (its configuration's
        ``max_image_pixels``), never one read from the file. ``check_digests=False`` verifies
        structure only, for writers that already checked every sample's digest from the bytes
        they wrote (the part merge).
        """
        from h5forge.verify.checks import verify_unsealed

        partial = self.partial
        with self.open_own() as h5:  # covers every attribute but itself and ``sealed``
            # modify() rewrites an attribute in place (h5py's item assignment deletes and
            # recreates it), keeping the root object header where the writer put it: the head.
            h5.attrs.modify(fmt.A_METADATA_SHA256, metadata_sha256(h5))
        # The data must be durable before the seal is written; flushing it to disk and reading
        # it back to verify are independent, so they run at the same time.
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(_fsync, partial)
            verify_unsealed(partial, max_pixels=max_pixels, check_digests=check_digests)
            synced.result()
        with self.open_own() as h5:
            h5.attrs.modify(fmt.A_SEALED, True)
        _fsync(partial)
        if not same_file(os.lstat(partial), self.lock.identity(partial)):
            raise UnsafePathError(f"{partial} is no longer the file this run created; not renamed")
        _replace(partial, out_path)
        self.lock.forget(partial)
        with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
            _fsync(out_path.parent)


@contextlib.contextmanager
def staged(
    out_path: Path,
    *,
    overwrite: bool,
    max_pixels: int,
    how: str = "",
    check_digests: bool = True,
) -> Iterator[Staged]:
    """Hold ``OUT.lock`` while the body writes ``OUT.partial``; seal and rename it after.

    The body writes the file (:meth:`Staged.create`) and flushes it; when it returns, the file
    is sealed and renamed (:meth:`Staged.seal`; ``max_pixels``, the writer's configured decode
    bound, is the one the seal's verification applies). An exception leaves nothing at
    ``out_path``. This run's partial files (and any other file made through :attr:`Staged.lock`) are
    removed either way; never a file it did not create.

    Raises:
        BusyError: another live run is writing ``out_path`` (the message names its pid and
            host).
        FileExistsError: ``out_path`` appeared meanwhile and ``overwrite`` is false.
    """
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out_path) as lock:  # BusyError while another run writes out_path
        # Again, now that no other run can: one may have finished since the caller checked.
        check_output(out_path, overwrite, how)
        lock.remove_leftovers()  # what a killed run recorded making: its partial and spool
        try:
            stage = Staged(partial=str(out_path) + fmt.PARTIAL_SUFFIX, lock=lock)
            yield stage
            stage.seal(out_path, max_pixels=max_pixels, check_digests=check_digests)
        finally:
            lock.discard()  # this run's partial and spool; never a file it did not create


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(partial: str, out_path: Path) -> None:
    """``os.replace``, with the blocks of a replaced file freed on a background thread.

    Replacing a large file makes the rename free all of its blocks (0.1 s for 350 MB on ext4)
    before it returns. An open descriptor keeps the old file's blocks allocated past the
    rename; closing it later frees them off the pack's path.
    """
    try:
        # Never blocks on a FIFO planted at the name, never opens through a link.
        old = os.open(out_path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # nothing to replace (or unreadable: the rename frees it as usual)
        old = -1
    try:
        os.replace(partial, out_path)
    finally:
        if old >= 0:
            threading.Thread(
                target=os.close, args=(old,), name="h5forge-free-replaced", daemon=True
            ).start()
