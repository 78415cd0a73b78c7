"""A ring of fixed-size slots in a shared-memory file: how the decode pool's workers hand back
decoded samples without the pipe.

Through the pool's pipe each sample (150 KB at 224x224 RGB) costs the consumer's process a
pickle round trip and several copies, CPU the decoders need. A worker instead writes the bytes
into its input's slot (``os.pwrite`` on the ring's path) and returns an :class:`InRing`, the
digest and shape only; the consumer's side reads each slot once (:meth:`Ring.take`) or lends it
(:meth:`Ring.borrow`). Which input owns which slot, and when, is the pool's business
(:mod:`h5forge.preprocess.pool`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, NamedTuple

from h5forge.preprocess.images import Processed

if TYPE_CHECKING:
    from h5forge.targets.store import StoredTargets

__all__ = ["InRing", "Ring"]


class InRing(NamedTuple):
    """A processed sample whose bytes a worker wrote into its ring slot (its targets, small,
    travel with it)."""

    sample: int
    shape: tuple[int, int, int]
    digest: bytes
    targets: StoredTargets | None = None


class Ring:
    """``slots`` slots of ``size`` bytes in a file in /dev/shm (or the temp folder).

    On Linux the file is unlinked at once and workers open it as ``/proc/<pid>/fd/<fd>``, so
    nothing is left behind even when the pack is killed; elsewhere it is unlinked on close.
    """

    def __init__(self, size: int, slots: int) -> None:
        self.size, self.slots = size, slots
        self._map: mmap.mmap | None = None
        folder = "/dev/shm"
        if not (
            os.path.isdir(folder)
            and os.access(folder, os.W_OK)
            and shutil.disk_usage(folder).free > 4 * size * slots
        ):
            folder = tempfile.gettempdir()
        self._fd, self._named = tempfile.mkstemp(prefix="h5forge-ring-", dir=folder)
        os.ftruncate(self._fd, size * slots)
        self.path = f"/proc/{os.getpid()}/fd/{self._fd}"
        if os.path.exists(self.path):
            os.unlink(self._named)
            self._named = ""
        else:
            self.path = self._named

    @property
    def spec(self) -> tuple[str, int, int]:
        """``(path, size, slots)``: what a worker needs to open the ring and find a slot."""
        return self.path, self.size, self.slots

    def take(self, r: InRing) -> Processed:
        """A copy of the slot's bytes, as the :class:`Processed` the worker made."""
        data = os.pread(self._fd, self.size, (r.sample % self.slots) * self.size)
        if len(data) != self.size:
            raise OSError(
                f"ring {self.path}: slot of input {r.sample} holds {len(data)} bytes, "
                f"expected {self.size}"
            )
        return Processed(r.sample, data, r.shape, r.digest, r.targets)

    def borrow(self, r: InRing) -> Processed:
        """The slot itself, read-only: valid until the slot is handed to another input."""
        if self._map is None:
            self._map = mmap.mmap(self._fd, self.size * self.slots, prot=mmap.PROT_READ)
        start = (r.sample % self.slots) * self.size
        view = memoryview(self._map)[start : start + self.size]
        return Processed(r.sample, view, r.shape, r.digest, r.targets)  # type: ignore[arg-type]

    def close(self) -> None:
        """Unmap and close the file (and unlink it where it still has a name)."""
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: GC frees it
                self._map.close()
        os.close(self._fd)
        if self._named:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._named)
