"""What an asset's HDF5 structure may hold, checked at open before any data is read.

HDF5 follows external links, external storage (a dataset whose bytes live in other files) and
virtual datasets (a dataset mapped from datasets of other files) on its own: an asset from
someone else could make a reader open any file the process can read (a local secret returned
as ``/classes``, a FIFO that hangs the reader). And a small file can declare datasets of any
size: HDF5 returns the fill value for storage that was never written, so reading a 78 KB file's
``(10**9, 2)`` index allocates 16 GB. Three checks keep both out, each before the first byte of
data is read:

* :func:`check_links` walks every link of the file once (``H5Lvisit``, which never follows a
  soft or external link) and refuses anything but hard links, virtual datasets, external
  storage, and a dataset (any but ``/images``) declaring more bytes than the file has; it also
  resolves every HDF5 filter the file uses (:func:`require_filters`). It only
  reads object headers, which the writer places in the head of the file, so a remote open
  costs no extra request. :func:`h5forge.asset.open.open_h5` runs it on every file it opens.
* :func:`h5forge.asset.declared.check_declared` compares every dataset's declared shape and
  type with the root attributes (``num_samples``, ``num_classes``, ``num_quarantined``) and the
  file's size; :func:`h5forge.asset.index.load_index` runs it before reading the index.
* :func:`require_filters` imports ``hdf5plugin`` (which registers Blosc, Zstd, LZ4, ... with
  HDF5) the first time a file needs a filter HDF5 does not have, in the one place every opener
  goes through, and says which extra to install when it is missing.

docs/FORMAT.md ("What readers refuse") lists the refusals.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.errors import IntegrityError, MissingExtraError

__all__ = ["FIX", "MAX_LINKS", "check_links", "require_filters"]

#: Most links a file may hold: an h5forge file has 14; a file with more is not one of ours, and
#: walking millions of links would make the open itself the attack.
MAX_LINKS = 1024

#: How a refusal of a file h5forge did not write (or that was altered) ends.
FIX = "the file was not written by h5forge or was altered after it was; re-fetch or re-pack it"


def check_links(h5: h5py.File, *, where: str) -> None:
    """Refuse soft, external and user-defined links, virtual datasets and external storage.

    Every link of the file is visited (groups nested at any depth, the root included); each
    dataset's creation properties are read from its object header. No dataset's data is read.

    Raises:
        IntegrityError: naming the object, what it points at, and that readers refuse it.
        MissingExtraError: a dataset uses a filter that needs ``hdf5plugin``, not installed.
    """
    links: list[tuple[bytes, int]] = []

    def visit(name: bytes, info: Any) -> bool | None:
        # The link's type comes with the visit: no lookup by name per link (slow in a group
        # of many links, and a lookup is what a hostile file would make us repeat).
        links.append((name, info.type))
        return True if len(links) > MAX_LINKS else None  # anything but None stops the walk

    try:
        h5.id.links.visit(visit, info=True)
    except (TypeError, KeyError, ValueError, RuntimeError) as e:
        raise IntegrityError(
            f"{where}: a link cannot be inspected ({type(e).__name__}: {e}); "
            f"h5forge files hold hard links only — {FIX}"
        ) from e
    if len(links) > MAX_LINKS:
        raise IntegrityError(
            f"{where} holds more than {MAX_LINKS} links (an h5forge file has about 14); {FIX}"
        )
    filters: dict[int, tuple[str, str]] = {}
    size = int(h5.id.get_filesize())
    for raw, kind in links:
        name = raw.decode("utf-8", "backslashreplace")
        if kind != h5py.h5l.TYPE_HARD:
            _refuse_link(h5, raw, kind, where)
        obj = h5.get(raw)  # a hard link: an object of this file (raw: names may not decode)
        if isinstance(obj, h5py.Dataset):
            _check_dataset(obj, f"/{name}", where, filters, size)
    require_filters(filters, where=where)


def _refuse_link(h5: h5py.File, raw: bytes, kind: int, where: str) -> None:
    """Raise the IntegrityError for a link that is not a hard link, saying where it points."""
    name = raw.decode("utf-8", "backslashreplace")
    try:
        link = h5.get(raw, getlink=True)  # the link itself, not followed
    except (TypeError, KeyError, ValueError, RuntimeError, OSError):
        link = None  # e.g. a user-defined link type h5py does not know
    if isinstance(link, h5py.SoftLink):
        raise IntegrityError(
            f"{where}: /{name} is a soft link to {link.path!r}; readers "
            f"refuse links (h5forge files hold hard links only) — {FIX}"
        )
    if isinstance(link, h5py.ExternalLink):
        raise IntegrityError(
            f"{where}: /{name} is an external link to {link.path!r} in file "
            f"{link.filename!r}; readers never follow a reference out of the file — {FIX}"
        )
    raise IntegrityError(
        f"{where}: /{name} is a link of type {kind}; h5forge files hold hard links only — {FIX}"
    )


def _check_dataset(
    ds: h5py.Dataset, name: str, where: str, filters: dict[int, tuple[str, str]], size: int
) -> None:
    dcpl = ds.id.get_create_plist()
    if name != "/" + fmt.IMAGES:  # /images: checked against the storage in check_declared
        # Any dataset may be read whole (verify hashes every one but /images): none may
        # declare more than the file holds, nor a chunk larger than it.
        item = 16 if ds.dtype.kind == "O" else ds.dtype.itemsize
        declared = int(np.prod(ds.shape, dtype=object)) * item if ds.shape else item
        chunk = int(np.prod(ds.chunks, dtype=object)) * item if ds.chunks else 0
        if max(declared, chunk) > size:
            raise IntegrityError(
                f"{where}: {name} declares {ds.shape} (chunks {ds.chunks}) of {ds.dtype} = "
                f"{max(declared, chunk)} bytes, more than the whole {size}-byte file; {FIX}"
            )
    if dcpl.get_layout() == h5py.h5d.VIRTUAL:
        source = dcpl.get_virtual_filename(0) if dcpl.get_virtual_count() else "?"
        raise IntegrityError(
            f"{where}: {name} is a virtual dataset mapped from {dcpl.get_virtual_count()} "
            f"source(s), the first in file {source!r}; readers never follow a reference out of "
            f"the file — {FIX}"
        )
    if dcpl.get_external_count():
        file, offset, size = dcpl.get_external(0)
        raise IntegrityError(
            f"{where}: {name} keeps its bytes in {dcpl.get_external_count()} external file(s), "
            f"the first {file!r} (offset {offset}, {size} bytes); readers never read outside "
            f"the file — {FIX}"
        )
    for k in range(dcpl.get_nfilters()):
        fid, _, _, fname = dcpl.get_filter(k)
        label = fname.decode("utf-8", "backslashreplace") if isinstance(fname, bytes) else fname
        filters.setdefault(int(fid), (str(label), name))


def require_filters(filters: dict[int, tuple[str, str]], *, where: str) -> None:
    """Make every HDF5 filter in ``filters`` (id -> (name, dataset)) available, or refuse.

    A filter HDF5 lacks is looked for in ``hdf5plugin``, imported here, lazily: only files
    that use a plugin codec pay for the import, and every opener resolves filters the same way.

    Raises:
        MissingExtraError: a filter is missing and ``hdf5plugin`` is not installed.
        IntegrityError: a filter neither HDF5 nor ``hdf5plugin`` provides.
    """
    missing = {fid: v for fid, v in filters.items() if not h5py.h5z.filter_avail(fid)}
    if not missing:
        return
    fid, (fname, name) = next(iter(sorted(missing.items())))
    try:
        import hdf5plugin  # noqa: F401  (importing it registers its filters with HDF5)
    except ImportError as e:
        raise MissingExtraError(
            f"{where}: {name} is compressed with the HDF5 filter {fname!r} (id {fid}), which "
            "needs the optional package hdf5plugin: pip install 'h5forge[plugins]'"
        ) from e
    for fid, (fname, name) in sorted(missing.items()):
        if not h5py.h5z.filter_avail(fid):
            raise IntegrityError(
                f"{where}: {name} uses the HDF5 filter {fname!r} (id {fid}), which neither "
                "HDF5 nor hdf5plugin provides, so its data cannot be read; h5forge writes "
                "gzip, lzf, blosc-lz4, zstd and fletcher32 only — re-pack the file"
            )
