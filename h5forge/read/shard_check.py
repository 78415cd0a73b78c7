"""A local shard checked against its manifest entry once per file identity, not once per open.

:class:`~h5forge.read.sharded.ShardedVersion` checks a local shard on the handle it reads
through (:class:`LocalCheck`: its size and its recomputed ``metadata_sha256``), besides the
single-file open-time checks (:func:`h5forge.read.state.open_state`): about 10 ms a shard.
DataLoader workers without ``persistent_workers`` are new processes every epoch, so each worker
paid that for every shard it read, every epoch (with ``shuffle=True`` every worker reads every
shard). :meth:`ShardedVersion.prepare <h5forge.read.sharded.ShardedVersion.prepare>` pays it
once, in the process that starts the workers (``loader()`` calls it before they fork), and keeps
what the checks found with the checked file's :class:`Identity`. A forked worker inherits that,
and :func:`reattach` opens only the byte reader and compares the identity of the descriptor it
reads through (``fstat``, not a path re-stat that a swap could race): the same file (device,
inode, size, mtime and ctime) reads with the index checked once; any difference (the shard
replaced, rewritten in place, or only touched) and the shard is opened and checked in full
again, so a changed file is refused with the same messages as before. The identity is taken
before the check reads the file, so a write during the check shows as a difference later. This
is the trust :mod:`h5forge.read.cache` gives a validated copy (its inode, size, mtime and ctime
unchanged); ctime cannot be set back by a user.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.open import H5_DAMAGE
from h5forge.asset.ranges import RangeReader
from h5forge.errors import IntegrityError, StoreError
from h5forge.location import Location
from h5forge.publish.manifest import ShardEntry
from h5forge.read.state import ProcessState
from h5forge.redact import redact_url

__all__ = ["Identity", "LocalCheck", "reattach"]


class Identity(NamedTuple):
    """What says a local file is unchanged since it was checked."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, fd: int) -> Identity:
        """The identity of the file open at descriptor ``fd``."""
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @classmethod
    def at(cls, where: Location) -> Identity | None:
        """The identity of the local file at ``where`` now (None: nothing there). A path's, so
        only a hint: what is read is compared by its descriptor (:func:`reattach`)."""
        try:
            st = os.stat(where.path)
        except FileNotFoundError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class LocalCheck:
    """The check that a local shard is the file its entry names, to run on the handle it is
    read through: its size and ``metadata_sha256`` (recomputed, never the attribute taken on
    trust), as :func:`h5forge.read.version.check_version_file` checks a version's file.
    ``identity``: the checked file's, taken before the check reads it (set once it passed).

    Raises (the check, and this for a missing shard):
        FileNotFoundError: the shard is missing (naming it).
        IntegrityError: it is another file.
    """

    def __init__(self, where: Location, entry: ShardEntry) -> None:
        self.entry = entry
        self.identity: Identity | None = None
        shown = redact_url(where.url)
        try:
            os.stat(where.path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shard {shown} of the version is missing: the asset's shards/ folder was "
                "pruned or only partly copied; copy the asset again, or publish the version again"
            ) from None
        self.replaced = (
            f"{shown} is not the shard {entry.sha256[:16]} its version's manifest names: it "
            "was replaced by another file; delete it and publish the version again"
        )

    def __call__(self, h5: Any) -> None:
        entry, replaced = self.entry, self.replaced
        fd = h5.id.get_vfd_handle() if h5.driver == "sec2" else None
        seen = Identity.of(int(fd)) if fd is not None else None
        size = h5.id.get_filesize()
        if size != entry.bytes:
            raise IntegrityError(
                f"{replaced} (it is {size} bytes, the manifest says {entry.bytes})"
            )
        try:
            found = metadata_sha256(h5)
        except StoreError:  # a failed store is no damage
            raise
        except H5_DAMAGE as e:
            raise IntegrityError(f"{replaced} ({type(e).__name__}: {e})") from None
        if found != entry.metadata_sha256:
            raise IntegrityError(
                f"{replaced} (its index and attributes hash to {found}, the manifest records "
                f"{entry.metadata_sha256})"
            )
        self.identity = seen


def reattach(checked: ProcessState, where: Location, identity: Identity) -> ProcessState | None:
    """``checked`` (a shard's state, opened and checked in this process or the one that forked
    it) reading through a new descriptor of ``where``, if that descriptor is the file checked.

    Returns:
        The state, or None when it must be opened and checked in full: the file's identity
        differs, it cannot be opened (the full open says why), or its images are filtered
        (they are read through an HDF5 handle, which is opened with the checks).
    """
    if checked.index.filtered:
        return None
    try:
        reader = RangeReader(where, size=identity.size)
    except (OSError, ValueError):
        return None
    if reader.fd is None or Identity.of(reader.fd) != identity:
        reader.close()
        return None
    return checked.reattached(reader)
