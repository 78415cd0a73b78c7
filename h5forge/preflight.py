"""Checks made before any work: is the source there, can the destination take the asset?

A build spends minutes fetching, packing, verifying and smoke-loading before it publishes; a
destination that exists, sits in a read-only folder or on a full disk, or lies inside the
source, must be found in the first second, not at the end. :func:`check_destination` does
that for local destinations (a probe file written and removed in the folder the asset goes
to) and, for remote ones, what is cheap (does it exist). :func:`check_not_in_source` is the
one rule, for local paths and URLs alike, that nothing a run writes (the asset, the Dask
staging, the fetch cache) is the source or lies inside it. :func:`check_url` refuses a URL of a
protocol fsspec does not know or with credentials in it; :func:`check_source` refuses a local
source that is not there, and a URL whose host name does not exist (a typo that would
otherwise fail only after the fetch's retries).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import posixpath
import secrets
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import fsspec
from fsspec.registry import known_implementations

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
    "check_not_in_source",
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
# fsspec's class for the local disk (file://, local://): one store, whatever the protocol.
_LOCAL_CLASS = "fsspec.implementations.local.LocalFileSystem"
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


def check_not_in_source(
    source: str, path: str, *, what: str = "destination", fix: str | None = None
) -> None:
    """Refuse a ``path`` a run writes (``what``: the destination, the staging, the cache) that
    is the source itself or lies inside it; before any work, reading neither.

    The rule follows fsspec, which does the writing. Local paths (plain, ``~``, ``file:`` or
    ``local:``, alone or at the end of a ``proto::`` chain) are compared once made absolute
    with links followed, and, where they exist, by device and inode (a bind mount, a case-
    insensitive disk). URLs are compared by store (``s3a://`` is ``s3://``, ``gcs://`` is
    ``gs://``: one fsspec class), bucket or host in any case, and path, both as written and
    with ``.``/``..`` resolved: ``s3://b/data/out.h5`` is inside ``s3://b/data``,
    ``s3://b/database.h5`` is not. A local path and a URL are never the same place.

    Raises:
        ValueError: naming both, what would go wrong, and the fix (``fix``; default: choose
            another ``what`` outside the source).
    """
    a, b = _place(source), _place(path)
    if a is None or b is None or a.store != b.store:
        return
    relation = _relation(a, b)
    if relation is None:
        return
    src = f"{_source_kind(a)} {_shown(source)}"
    fix = fix or f"choose a {what} outside {_shown(source)}"
    if relation == "same":
        raise ValueError(
            f"{what} {_shown(path)} is the {src} itself: the run would replace what it reads; {fix}"
        )
    raise ValueError(
        f"{what} {_shown(path)} is inside the {src}: what the run writes there would become "
        f"part of the source (and a rebuild would read it back); {fix}"
    )


@dataclass(frozen=True)
class _Place:
    """Where a URL points: its store (``""`` for the local disk, else the fsspec class) and
    its path there (for a URL, ``/bucket/key``)."""

    store: str
    paths: tuple[str, ...]  # local: the resolved path; remote: as written, and normalised
    local: Path | None = None  # the local path as fsspec reads it (before links are followed)


def _place(url: str) -> _Place | None:
    """The store and path(s) of ``url``; None where there is nothing to compare (empty)."""
    url = url.strip()
    if not url:
        return None
    target = url.rsplit("::", 1)[-1]  # simplecache::s3://b/k names s3://b/k
    protocol, sep, rest = target.partition("://")
    if not sep:  # a plain path, "file:/x" or "local:/x": fsspec's LocalFileSystem
        for prefix in ("file:", "local:"):
            if target.lower().startswith(prefix):
                target = target[len(prefix) :]
                break
        return _local_place(target)
    store = known_implementations.get(protocol.lower(), {}).get("class", protocol.lower())
    if store == _LOCAL_CLASS:  # file://, local://, FILE:// (fsspec strips the protocol)
        return _local_place(rest)
    # The bucket (or host) and the key, as one path: s3:///b/k is s3://b/k to fsspec, and
    # memory://x/y is memory:///x/y. A bucket or host name has no case; a key has.
    bucket, _, key = rest.split("?", 1)[0].split("#", 1)[0].strip("/").partition("/")
    written = f"/{bucket.lower()}/{key}".rstrip("/")
    return _Place(store, (written, posixpath.normpath(written)))


def _local_place(path: str) -> _Place:
    local = Path(path or ".").expanduser()
    return _Place("", (str(local.resolve()),), local)


def _relation(source: _Place, path: _Place) -> str | None:
    """``"same"``, ``"inside"`` or None (neither) of ``path`` to ``source``."""
    for src in source.paths:
        for dst in path.paths:
            if dst == src:
                return "same"
            if dst.startswith(src.rstrip("/") + "/"):
                return "inside"
    if source.local is not None and path.local is not None:
        # The same folder under another name: a bind mount, a case-insensitive disk.
        try:
            st = source.local.stat()
        except OSError:
            return None  # not there yet: the names above are all there is to compare
        here = Path(path.paths[0])
        for i, folder in enumerate((here, *here.parents)):
            try:
                found = folder.stat()
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino):
                return "same" if i == 0 else "inside"
    return None


def _source_kind(source: _Place) -> str:
    """The source named in a message: "source folder", "source archive" (a local file), or
    "source" (remote, or not there yet)."""
    if source.local is not None:
        if source.local.is_dir():
            return "source folder"
        if source.local.exists():
            return "source archive"
    return "source"


def _shown(url: str) -> str:
    return printable(redact_url(url) if local_path(url) is None else url)


def check_destination(
    dest: Location,
    *,
    source: str | None = None,
    overwrite: bool = False,
) -> None:
    """Raise now if the asset could not be published at ``dest``.

    ``dest`` is not the source nor inside it (:func:`check_not_in_source`). Local: ``dest``
    is not a folder, exists only with ``overwrite``, and its folder (or the nearest existing
    one above it, where it would be created) takes a probe file of :data:`PROBE_BYTES`.
    Remote: exists only with ``overwrite``.

    Raises:
        ValueError: ``dest`` is the source, inside it, or a folder.
        DestinationExistsError: ``dest`` exists and ``overwrite`` is False.
        OSError: the folder cannot be written (read-only, permission, disk full), worded by
            :func:`h5forge.messages.describe_os_error`, errno kept.
    """
    url = dest.url
    if source:
        check_not_in_source(source, url)
    path = local_path(url)
    if path is None:
        if not overwrite and dest.ask("whether it exists", "exists", dest.path):
            raise DestinationExistsError(str(dest))
        return
    target = path.resolve()
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
