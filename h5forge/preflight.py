"""Checks made before any work: is the source there, can the destination take the asset?

A build spends minutes fetching, packing, verifying and smoke-loading before it publishes; a
destination that exists, sits in a read-only folder or on a full disk, or lies inside the
source, must be found in the first second, not at the end. :func:`check_destination` does
that for local destinations (a probe file written and removed in the folder the asset goes
to) and, for remote ones, what is cheap (does it exist). :func:`check_url` refuses a URL of a
protocol fsspec does not know or with credentials in it; :func:`check_source` refuses a local
source that is not there, and a URL whose host name does not exist (a typo that would
otherwise fail only after the fetch's retries).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import fsspec

from h5forge.errors import DestinationExistsError
from h5forge.files import create_exclusive
from h5forge.location import Location
from h5forge.messages import describe_os_error, reworded
from h5forge.redact import redact_url
from h5forge.text import printable

__all__ = [
    "PROBE_BYTES",
    "RESOLVE_TIMEOUT_S",
    "check_destination",
    "check_host",
    "check_source",
    "check_url",
    "local_path",
]

#: Bytes the probe writes (and fsyncs): enough that a full file system refuses it, small
#: enough to cost nothing.
PROBE_BYTES = 64 << 10
#: Seconds a host name lookup may take before :func:`check_host` leaves the question to the
#: fetch (a slow resolver is not a wrong name).
RESOLVE_TIMEOUT_S = 1.5
# Protocols whose URL names a host (for s3://, gs://, memory:// it is a bucket or nothing).
_HOSTED = frozenset({"http", "https", "ftp", "sftp", "ssh", "smb", "webdav", "webhdfs"})
# fsspec can read these but not write them.
_READ_ONLY = frozenset({"http", "https", "github", "zip", "tar", "libarchive", "reference"})
# The resolver's "this name does not exist" (not "try again later": EAI_AGAIN).
_NO_SUCH_HOST = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)


def local_path(url: str) -> Path | None:
    """The local path of ``url`` (a plain path or ``file://``), or None for other stores."""
    if url.startswith("file://"):
        return Path(url[len("file://") :]).expanduser()
    if "://" in url or "::" in url:
        return None
    return Path(url).expanduser()


def check_url(url: str, *, what: str, writable: bool = False) -> str:
    """Check that ``url`` is a local path or a URL of a protocol fsspec knows, without secrets.

    Returns:
        ``url`` without surrounding blanks.

    Raises:
        ValueError: empty, unknown protocol, read-only protocol for a destination, or embedded
            credentials (they belong in a Secret block, not in a parameter Prefect records).
    """
    url = url.strip()
    if not url:
        raise ValueError(f"{what} is empty; give a local path or a URL such as s3://bucket/key")
    if redact_url(url) != url:
        raise ValueError(
            f"{what} {redact_url(url)!r} embeds credentials (user:password@ or a signed token); "
            "store them in a Prefect Secret block and name it in credentials_block"
        )
    if "://" not in url:
        return url
    known = set(fsspec.available_protocols())
    for part in url.split("::"):
        protocol = part.split("://", 1)[0].lower() if "://" in part else part.lower()
        if protocol not in known:
            raise ValueError(
                f"{what} {url!r} uses protocol {protocol!r}, which fsspec does not know; use a "
                f"local path or one of {', '.join(sorted(p for p in known if len(p) <= 6))} ..."
            )
        if writable and protocol in _READ_ONLY:
            raise ValueError(
                f"{what} {url!r}: protocol {protocol!r} is read-only in fsspec; publish to a "
                "local path or a writable store (s3://, gs://, az://, memory://, ...)"
            )
    return url


def check_host(url: str, *, what: str, timeout: float = RESOLVE_TIMEOUT_S) -> None:
    """Refuse a URL naming a host that does not exist (``ftp://hots/x``), within ``timeout``.

    Only the resolver's "no such name" refuses: a lookup that is slow or fails for a reason
    that may pass (no network yet, EAI_AGAIN) leaves the question to the fetch and its retries.

    Raises:
        ValueError: the host name does not resolve; the message names it and the fix.
    """
    parts = urlsplit(url.split("::", 1)[0])
    host = parts.hostname if parts.scheme.lower() in _HOSTED else None
    if not host:
        return
    try:
        ipaddress.ip_address(host)
        return  # an address, nothing to look up
    except ValueError:
        pass
    found: list[OSError | None] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, None)
            found.append(None)
        except OSError as e:
            found.append(e)

    thread = threading.Thread(target=lookup, name="h5forge-check-host", daemon=True)
    thread.start()
    thread.join(timeout)
    error = found[0] if found else None
    if isinstance(error, socket.gaierror) and error.errno in _NO_SUCH_HOST:
        raise ValueError(
            f"{what} {printable(redact_url(url))}: host {printable(host)!r} does not exist "
            f"({error.strerror}); check the host name, or give a local folder or archive"
        )


def check_source(source: str) -> None:
    """Refuse a source that cannot be fetched, before any work.

    A local source must exist; a URL must be of a protocol fsspec knows (:func:`check_url`)
    and name a host that exists (:func:`check_host`). Whether the object is there is left to
    the fetch (it may need credentials).

    Raises:
        FileNotFoundError: a local source that is not there, naming the path.
        ValueError: an unknown protocol, credentials in the URL, or a host that does not exist.
    """
    source = check_url(source, what="source")
    path = local_path(source)
    if path is None:
        check_host(source, what="source")
    elif not path.exists():
        raise FileNotFoundError(
            f"source {printable(source)} does not exist: check the path (pack takes an image "
            "folder; build also an archive such as data.tar.gz, or a URL such as "
            "s3://bucket/prefix/)"
        )


def check_destination(
    dest: Location,
    *,
    source: str | None = None,
    overwrite: bool = False,
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
    url = dest.url
    path = local_path(url)
    if path is None:
        if not overwrite and dest.fs.exists(dest.path):
            raise DestinationExistsError(str(dest))
        return
    target = path.resolve()
    src = local_path(source) if source else None
    if src is not None and src.exists():
        src = src.resolve()
        if target == src:
            raise ValueError(
                f"destination {printable(url)} is the source archive itself; "
                "publishing would replace it: choose another destination"
            )
        if src.is_dir() and src in target.parents:
            raise ValueError(
                f"destination {printable(url)} is inside the source folder "
                f"{printable(source)}: the asset, its sidecar and its preview would become "
                "part of the source; choose a destination outside it"
            )
    if target.is_dir():
        raise ValueError(
            f"destination {printable(url)} is a folder; give the path of the "
            ".h5 file to write in it"
        )
    if target.exists() and not overwrite:
        raise DestinationExistsError(printable(url))
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(
            f"destination {printable(url)}: {printable(folder)} is a file, not a folder"
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
