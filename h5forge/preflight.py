"""Checks made before any work: can the destination take the asset, and is it not the source?

A build spends minutes fetching, packing, verifying and smoke-loading before it publishes; a
destination that exists, sits in a read-only folder or on a full disk, or lies inside the
source, must be found in the first second, not at the end. :func:`check_destination` does
that for local destinations (a probe file written and removed in the folder the asset goes
to) and, for remote ones, what is cheap (does it exist). :func:`check_source` refuses a local
source that is not there.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Any

from h5forge.errors import DestinationExistsError
from h5forge.files import create_exclusive
from h5forge.messages import describe_os_error, reworded
from h5forge.redact import redact_url
from h5forge.text import printable

__all__ = ["PROBE_BYTES", "check_destination", "check_source", "local_path"]

#: Bytes the probe writes (and fsyncs): enough that a full file system refuses it, small
#: enough to cost nothing.
PROBE_BYTES = 64 << 10


def local_path(url: str) -> Path | None:
    """The local path of ``url`` (a plain path or ``file://``), or None for other stores."""
    if url.startswith("file://"):
        return Path(url[len("file://") :]).expanduser()
    if "://" in url or "::" in url:
        return None
    return Path(url).expanduser()


def check_source(source: str) -> None:
    """Refuse a local source that does not exist (URLs are left to the fetch).

    Raises:
        FileNotFoundError: naming the path.
    """
    path = local_path(source)
    if path is not None and not path.exists():
        raise FileNotFoundError(
            f"source {printable(source)} does not exist: give an image folder, an archive "
            "(.tar.gz, .zip ...) or a URL such as s3://bucket/prefix/"
        )


def check_destination(
    dest: str,
    *,
    source: str | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Raise now if the asset could not be published at ``dest``.

    Local: ``dest`` is not the source archive nor inside the source folder, is not a folder,
    exists only with ``overwrite``, and its folder (or the nearest existing one above it,
    where it would be created) takes a probe file of :data:`PROBE_BYTES`. Remote: exists only
    with ``overwrite``.

    Raises:
        ValueError: ``dest`` is the source, inside it, or a folder.
        DestinationExistsError: ``dest`` exists and ``overwrite`` is False.
        OSError: the folder cannot be written (read-only, permission, disk full), worded by
            :func:`h5forge.messages.describe_os_error`, errno kept.
    """
    path = local_path(dest)
    if path is None:
        from h5forge.asset.open import url_to_fs

        fs, remote = url_to_fs(dest, storage_options)
        if not overwrite and fs.exists(remote):
            raise DestinationExistsError(redact_url(dest))
        return
    target = path.resolve()
    src = local_path(source) if source else None
    if src is not None and src.exists():
        src = src.resolve()
        if target == src:
            raise ValueError(
                f"destination {printable(dest)} is the source archive itself; "
                "publishing would replace it: choose another destination"
            )
        if src.is_dir() and src in target.parents:
            raise ValueError(
                f"destination {printable(dest)} is inside the source folder "
                f"{printable(source)}: the asset, its manifest and its preview would become "
                "part of the source; choose a destination outside it"
            )
    if target.is_dir():
        raise ValueError(
            f"destination {printable(dest)} is a folder; give the path of the "
            ".h5 file to write in it"
        )
    if target.exists() and not overwrite:
        raise DestinationExistsError(printable(dest))
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(
            f"destination {printable(dest)}: {printable(folder)} is a file, not a folder"
        )
    _probe(folder)


def _probe(folder: Path) -> None:
    """Create, fill, fsync and remove a probe file in ``folder``; raise a worded OSError."""
    probe = folder / f".h5forge-probe-{secrets.token_hex(6)}"
    try:
        # Exclusive and not through a link: a name planted there is never written through.
        fd = create_exclusive(probe, 0o600)
    except OSError as e:
        raise _unwritable(e, folder) from e
    try:
        block = memoryview(b"\0" * PROBE_BYTES)
        while block:  # a nearly full disk takes part of a write; the next one fails
            block = block[os.write(fd, block) :]
        os.fsync(fd)
    except OSError as e:
        raise _unwritable(e, folder) from e
    finally:
        os.close(fd)
        os.unlink(probe)


def _unwritable(e: OSError, folder: Path) -> OSError:
    # Name the folder, not the probe's random name.
    about_folder = OSError(e.errno, e.strerror, str(folder))
    text = describe_os_error(about_folder)
    if e.errno in (errno.ENOENT, errno.EINVAL, errno.EOPNOTSUPP):  # e.g. /proc, /sys
        text = f"{printable(folder)} does not take new files ({e.strerror})"
    return reworded(e, "cannot write the destination: " + text)
