"""Where bytes live: a URL and its storage options, resolved once, printed redacted.

:class:`Location` is the one I/O seam of the library. The public entry points (the readers,
``verify``, ``publish``, ``fetch``, the CLI) accept a URL string plus ``storage_options`` or a
``Location``, and convert once (:meth:`Location.of`); everything inside passes the value whole.
It is the one place that:

- resolves a URL into its fsspec filesystem and path (:attr:`Location.fs`,
  :attr:`Location.path`: once, lazily, never pickled: a pickled ``Location`` is its URL and
  options, and each process resolves its own filesystem), an S3 one with h5forge's retry
  policy unless the options set their own (:data:`S3_RETRIES`);
- tells local files from remote ones (:attr:`Location.is_local`);
- prints itself: ``str()`` and ``repr()`` show the redacted URL, never the options, which may
  hold credentials; :attr:`Location.key` is the credential-free canonical URL (a cache key);
- reads an untrusted JSON document (:meth:`Location.read_json`): bounded in bytes and in
  nesting depth, one request on a remote store, non-blocking and regular files only on a local
  disk, one error type (:class:`DocumentError`) naming the document;
- bounds every call to a remote store in time as a whole (:meth:`Location.read_timeout`: the
  client's own attempts plus the bytes at :data:`h5forge.store_errors.MIN_READ_RATE`), and
  copies (:meth:`Location.download`) or hashes (:meth:`Location.sha256`) a remote file in
  ``CHUNK``-byte ranged reads so bounded (:meth:`Location.read_range`);
- writes atomically (:meth:`Location.put`: temp name, fsync and rename on a local disk, one
  upload elsewhere).

The bound of each kind of document h5forge reads is defined here, once (``MAX_*_BYTES``).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import os
import posixpath
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from types import MappingProxyType
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from h5forge.documents import MAX_JSON_DEPTH, DocumentError, parse_json
from h5forge.errors import IntegrityError
from h5forge.files import NONBLOCK, create_exclusive, fsync_dir, sha256_fd
from h5forge.locks import flock
from h5forge.redact import canonical_url, redact_url
from h5forge.s3_session import share_models
from h5forge.store_errors import MIN_READ_RATE, store_failures

__all__ = [
    "CHUNK",
    "MAX_ASSET_LIST_BYTES",
    "MAX_CACHE_RECORD_BYTES",
    "LISTED_ENTRY_BYTES",
    "MAX_COCO_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_LINEAGE_BYTES",
    "MAX_LISTING_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_SIDECAR_BYTES",
    "MAX_POINTER_BYTES",
    "PreconditionError",
    "S3_RETRIES",
    "SIDECAR_SUFFIX",
    "TEMP_MARK",
    "DocumentError",
    "Location",
    "TempFile",
    "temp_copy",
]

#: Bytes per read when hashing or copying: large sequential reads, few round trips.
CHUNK = 8 << 20

# One bound per kind of document read from outside (docs/FORMAT.md, "untrusted input").
#: A sample listing (CSV or JSON lines, streamed row by row, never parsed whole).
MAX_LISTING_BYTES = 2 * 2**30
#: A COCO annotation file (COCO 2017's train instances are 448 MB), parsed whole by discover.
MAX_COCO_BYTES = 2**30
#: A published sidecar ``NAME.h5.manifest.json``: a few KiB, counts per class included.
MAX_SIDECAR_BYTES = 16 * 2**20
#: A multi-asset list: 10,000 entries of a few hundred bytes.
MAX_ASSET_LIST_BYTES = 4 * 2**20
#: The pointer ``BASE.latest.json`` naming the latest version: a few hundred bytes.
MAX_POINTER_BYTES = 64 * 2**10
#: A version's lineage (its sources map, one fingerprint per source file).
MAX_LINEAGE_BYTES = 64 * 2**20
#: A verified-cache entry's record: a few hundred bytes.
MAX_CACHE_RECORD_BYTES = 64 * 2**10
#: A sharded version's manifest (about 8 bytes per deleted row, 400 per shard).
MAX_MANIFEST_BYTES = 256 * 2**20

#: The published sidecar of ``NAME.h5`` is ``NAME.h5`` + this suffix.
SIDECAR_SUFFIX = ".manifest.json"

#: botocore's retries for ``s3://`` unless ``config_kwargs`` names its own: backoff, 4 attempts,
#: inside s3fs's 5 tries of a throttled or dropped request (docs/remote.md, "Throttling ...").
S3_RETRIES: Mapping[str, Any] = MappingProxyType({"mode": "standard", "max_attempts": 3})
_S3_PROTOCOLS = ("s3", "s3a")  # S3 and S3-compatible stores (that implement If-Match)
#: The longest one call of an asyncio filesystem other than S3 may take before its bytes are
#: counted (aiohttp's own total bound for one request, which ``http(s)://`` reads use).
_OTHER_CLIENT_SECONDS = 300.0
#: Bytes of one object's entry in a listing's answer, at most (S3's XML: key, size, ETag, time,
#: class): what a listing of N objects may take is bounded as a read of N entries.
LISTED_ENTRY_BYTES = 1024
# Protocols whose filesystem is never the local disk (``is_local`` needs no filesystem built).
_REMOTE_PROTOCOLS = frozenset({*_S3_PROTOCOLS, "gs", "gcs", "http", "https", "az", "abfs", "abfss"})


class Location:
    """A URL plus its storage options: where bytes live, for reading and writing.

    Immutable; equal when URL and options are equal. Build one with :meth:`of` at a public
    edge. Plain local paths are file locations.

    Attributes:
        url: the URL as given (may hold credentials in a signed query: print the Location,
            not this).
        options: the fsspec storage options, read-only (never printed, pickled as given).
    """

    url: str
    options: Mapping[str, Any]

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(
                f"a location needs a non-empty URL or path, not {type(url).__name__} "
                f"{redact_url(str(url))!r:.80}"
            )
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ValueError(
                f"storage_options must be a mapping of fsspec options, not "
                f"{type(storage_options).__name__}"
            )
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "options", MappingProxyType(dict(storage_options or {})))

    @classmethod
    def of(
        cls,
        where: str | os.PathLike[str] | Location,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Location:
        """The location of ``where``: a URL or local path (with ``storage_options``) or a
        ``Location`` (returned as is).

        Raises:
            ValueError: ``where`` is empty or not a URL, or a ``Location`` comes with
                ``storage_options`` too (a location carries its own).
        """
        if isinstance(where, Location):
            if storage_options:
                raise ValueError(
                    f"{where} is a Location, which carries its own storage options; pass "
                    "storage_options only with a URL string"
                )
            return where
        if isinstance(where, os.PathLike):
            where = os.fspath(where)
        return cls(where, storage_options)

    def with_url(self, url: str) -> Location:
        """Another URL on the same store, with the same options."""
        return Location(url, self.options)

    # --- identity and printing ------------------------------------------------------------
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Location is immutable; cannot set {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Location, (self.url, dict(self.options)))  # never the resolved filesystem

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Location):
            return NotImplemented
        return (self.url, self.options) == (other.url, other.options)

    def __hash__(self) -> int:
        return hash(self.url)

    def __str__(self) -> str:
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"Location({redact_url(self.url)!r})"

    @property
    def key(self) -> str:
        """The canonical, credential-free URL: one key per object however it was signed."""
        return canonical_url(self.url)

    # --- resolution -----------------------------------------------------------------------
    @cached_property
    def _resolved(self) -> tuple[Any, str]:
        fs, path = fsspec.core.url_to_fs(self.url, **self.client_options)
        return (share_models(fs) if self.protocol in _S3_PROTOCOLS else fs), path

    @property
    def client_options(self) -> dict[str, Any]:
        """The options the filesystem is built with: :attr:`options`, and for ``s3://`` the
        retry policy :data:`S3_RETRIES` unless ``config_kwargs`` names ``retries`` (a user's
        own policy wins, whole; their other ``config_kwargs`` are kept)."""
        options = dict(self.options)
        config = options.get("config_kwargs")
        if isinstance(config, Mapping):  # a copy: botocore rewrites its retries in place
            options["config_kwargs"] = config = copy.deepcopy(dict(config))
        if self.protocol in _S3_PROTOCOLS and "retries" not in (config or {}):
            options["config_kwargs"] = {**(config or {}), "retries": dict(S3_RETRIES)}
        return options

    def read_timeout(self, nbytes: int) -> dict[str, float]:
        """The keyword that bounds one call of :attr:`fs` reading ``nbytes`` here, in seconds
        (fsspec's ``timeout`` of its asyncio filesystems; raises ``FSTimeoutError``): every
        attempt the client may make (for ``s3://``: s3fs's tries of botocore's attempts, each
        its connect and read timeouts, and the waits between them) plus ``nbytes`` at
        :data:`MIN_READ_RATE`. ``{}`` where the filesystem is not asyncio-based (a local
        path, ``memory://``): its calls are not bounded here."""
        client = self._client_seconds
        return {} if client is None else {"timeout": client + nbytes / MIN_READ_RATE}

    @cached_property
    def _client_seconds(self) -> float | None:
        """The most time the client's own attempts at one request may take (see
        :meth:`read_timeout`), or None where calls are not bounded here."""
        fs = self.fs
        if self.is_local or not getattr(fs, "async_impl", False):
            return None
        if self.protocol not in _S3_PROTOCOLS:
            return _OTHER_CLIENT_SECONDS
        config = self.client_options.get("config_kwargs") or {}
        timeouts = float(config.get("connect_timeout", getattr(fs, "connect_timeout", 60)))
        timeouts += float(config.get("read_timeout", getattr(fs, "read_timeout", 60)))
        retries = config.get("retries") or {}
        if isinstance(retries.get("total_max_attempts"), int):
            attempts = retries["total_max_attempts"]
        else:  # botocore's own default: 4 retries
            attempts = int(retries.get("max_attempts", 4)) + 1
        tries = int(getattr(fs, "retries", 5))  # s3fs's, each botocore's attempts
        waits = sum(min(2.0**i, 20.0) for i in range(attempts - 1))
        return tries * (attempts * timeouts + waits) + sum(
            min(0.1 * 1.7**i, 15.0) for i in range(tries)
        )

    @property
    def protocol(self) -> str:
        """The URL's scheme, lower case (``"file"`` for a plain path)."""
        return self.url.split("://", 1)[0].lower() if "://" in self.url else "file"

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, built with :attr:`client_options` once per process."""
        return self._resolved[0]

    @property
    def path(self) -> str:
        """The path on :attr:`fs`."""
        return self._resolved[1]

    @property
    def is_local(self) -> bool:
        """True for the local disk: HDF5 opens it itself and the reader can ``pread``. A URL of
        a known remote protocol answers without building its filesystem (an S3 one makes a
        botocore session: ~12 ms, which an open served by the cache never needs)."""
        if "_resolved" not in self.__dict__ and self.protocol in _REMOTE_PROTOCOLS:
            return False
        return isinstance(self.fs, LocalFileSystem)

    # --- derived locations ----------------------------------------------------------------
    def sibling(self, suffix: str) -> Location:
        """``URL + suffix`` (before a signed URL's query string), with the same options."""
        if "://" in self.url and "?" in self.url:
            base, _, query = self.url.partition("?")
            return self.with_url(f"{base}{suffix}?{query}")
        return self.with_url(self.url + suffix)

    @property
    def sidecar(self) -> Location:
        """The published sidecar ``NAME.h5.manifest.json`` of the file here."""
        return self.sibling(SIDECAR_SUFFIX)

    def join(self, *names: str) -> Location:
        """A child of the folder here: ``join("v", "a.h5")`` is ``URL/v/a.h5``."""
        if "://" in self.url and "?" in self.url:
            base, _, query = self.url.partition("?")
            return self.with_url(posixpath.join(base.rstrip("/"), *names) + f"?{query}")
        return self.with_url(posixpath.join(self.url.rstrip("/") or "/", *names))

    # --- reading --------------------------------------------------------------------------
    def read_json(self, *, limit: int, what: str) -> Any:
        """The JSON document here, read as untrusted input.

        At most ``limit + 1`` bytes are read (one ranged GET on a remote store, no size lookup
        first); a local file is opened non-blocking and must be a regular file (a FIFO or a
        device planted under a document's name is refused, never waited on). Nesting deeper
        than :data:`MAX_JSON_DEPTH` is refused before parsing.

        Args:
            limit: the largest document accepted, in bytes (one of the ``MAX_*_BYTES``).
            what: the kind of document, for messages ("published sidecar").

        Raises:
            FileNotFoundError: nothing here.
            DocumentError: over ``limit``, nested too deep, not JSON, or not a regular file.
        """
        return parse_json(self.read_bytes(limit=limit, what=what), what=what, name=str(self))

    def read_bytes(self, *, limit: int, what: str) -> bytes:
        """The document here as bytes, read as :meth:`read_json` reads it (bounded, regular
        files only) but not parsed: for a document whose bytes are hashed (a version manifest).

        Raises:
            FileNotFoundError: nothing here.
            DocumentError: over ``limit``, or not a regular file.
        """
        raw, size = self._read_bounded(limit, what)
        if size > limit:
            raise DocumentError(
                f"{what} {str(self)!r} is {size} bytes, over {limit} bytes, the bound for a "
                f"{what}: h5forge did not write it; remove it or write it again"
            )
        return raw

    def _read_bounded(self, limit: int, what: str) -> tuple[bytes, int]:
        """``(at most limit + 1 bytes, size)``; ``size`` is exact only past the bound."""
        if not self.is_local:
            fs, path = self.fs, self.path
            fs.invalidate_cache(path)  # documents change (a pointer moves): never a stale listing
            raw = fs.cat_file(path, start=0, end=limit + 1, **self.read_timeout(limit + 1))
            return raw, (fs.size(path, **self.read_timeout(0)) if len(raw) > limit else len(raw))
        fd = os.open(self.path, os.O_RDONLY | NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise DocumentError(
                    f"{what} {str(self)!r} is not a regular file (a FIFO, device or folder "
                    "under a document's name); remove it"
                )
            if st.st_size > limit:
                return b"", st.st_size
            chunks, got = [], 0
            while got <= limit and (block := os.read(fd, limit + 1 - got)):
                chunks.append(block)
                got += len(block)
            return b"".join(chunks), got
        finally:
            os.close(fd)

    def sha256(self, chunk: int = CHUNK) -> str:
        """The hex sha256 of the file here, streamed in ``chunk``-byte reads.

        Raises:
            FileNotFoundError: nothing here.
            ValueError: a local path that is not a regular file (a FIFO is never waited on).
        """
        if chunk < 1:
            raise ValueError(f"chunk={chunk} must be >= 1 byte")
        if self.is_local:
            fd = os.open(self.path, os.O_RDONLY | NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ValueError(
                        f"{str(self)!r} is not a regular file (a FIFO, device or folder): "
                        "there is nothing to hash; give the path of a file"
                    )
                return sha256_fd(fd, chunk=chunk)[0]
            finally:
                os.close(fd)
        digest = hashlib.sha256()
        size = int(self.fs.size(self.path, **self.read_timeout(0)))
        for start in range(0, size, chunk):
            digest.update(self.read_range(start, min(size, start + chunk)))
        return digest.hexdigest()

    def download(
        self,
        fd: int,
        *,
        path: str | None = None,
        size: int | None = None,
        advance: Callable[[int], object] | None = None,
    ) -> str:
        """Write the remote file here (or ``path`` on the same filesystem) to ``fd``, a new
        file's descriptor (closed here), and return its sha256: ``size`` bytes (default: the
        size the store lists) in ``CHUNK``-byte ranged reads (:meth:`read_range`, each bounded
        in time), the last asking for one byte more, so that a file of another size is refused
        without reading its extra bytes. ``advance(n)`` is called with each read's bytes.

        Raises:
            IntegrityError: the store has more or fewer bytes than ``size``.
            StoreError: the store kept failing, or answered too slowly.
        """
        name = path or self.path
        if size is None:
            size = int(self.fs.size(name, **self.read_timeout(0)))
        digest, start = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for end in [*range(CHUNK, size, CHUNK), size + 1]:
                want = min(end, size) - start
                try:
                    block = self.read_range(start, end, path=path)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    block = b""  # 416, nothing at ``start``: right for an empty file alone
                    cause: OSError | None = e
                else:
                    cause = None
                if len(block) != want:
                    how = "more" if len(block) > want else "fewer"
                    raise IntegrityError(
                        f"{self}: the store has {how} bytes in {name} than the {size} it "
                        "lists (or its manifest records): it changed during the copy, or the "
                        "store answers wrong; nothing was kept — copy it again"
                    ) from cause
                out.write(block)
                digest.update(block)
                if advance is not None:
                    advance(len(block))
                start = end
        return digest.hexdigest()

    def ask(self, what: str, method: str, *args: Any, listed: int = 0, **kwargs: Any) -> Any:
        """``fs.<method>(*args, **kwargs)``, a question to the store (``info``, ``isdir``, a
        listing: ``find``), bounded in time as a read of ``listed`` objects' entries
        (:data:`LISTED_ENTRY_BYTES` each) would be, a failure raised as the
        :class:`~h5forge.errors.StoreError` that names ``what`` was asked."""
        with store_failures(self, what):
            limit = self.read_timeout(listed * LISTED_ENTRY_BYTES)
            return getattr(self.fs, method)(*args, **kwargs, **limit)

    def read_range(self, start: int, end: int, *, path: str | None = None) -> bytes:
        """Bytes ``start`` to ``end - 1`` of the remote file here (or of ``path`` on the same
        filesystem: a prefix's object), fewer at its end, in one request bounded in time as a
        whole (:meth:`read_timeout`: an answer trickled a byte at a time is cut off).

        Raises:
            StoreError: the store kept failing, or answered too slowly.
        """
        of = "" if path is None else f" of {path}"
        with store_failures(self, f"bytes {start}-{end - 1}{of}"):
            limit = self.read_timeout(end - start)
            return bytes(self.fs.cat_file(path or self.path, start=start, end=end, **limit))

    # --- writing --------------------------------------------------------------------------
    def put(
        self, *, local: str | os.PathLike[str] | None = None, data: bytes | None = None
    ) -> None:
        """Write the local file ``local`` (or ``data``) here, atomically where the store can.

        On a local disk: a temp name beside the target (created exclusively, locked, fsynced),
        then a rename that replaces whatever had the name (a file, a planted symlink) and an
        fsync of the folder. Other stores: one upload (an object store's PUT is atomic).
        """
        if (local is None) == (data is None):
            raise ValueError("put needs exactly one of local= or data=")
        source = os.fspath(local) if local is not None else None
        fs, path = self.fs, self.path
        if not self.is_local:
            if source is not None:
                fs.put_file(source, path)
            else:
                fs.pipe_file(path, data)
            fs.invalidate_cache(path)
            return
        parent = posixpath.dirname(path)
        fs.makedirs(parent, exist_ok=True)
        with temp_copy(path, source, data) as tmp:
            tmp.unlock()
            os.rename(tmp.path, path)
        fsync_dir(parent)  # persist the rename itself

    # --- conditional writes (object stores that have them) ---------------------------------
    @property
    def conditional(self) -> bool:
        """Whether writes here can be conditional on what is there (S3's ``If-Match`` /
        ``If-None-Match`` on a PUT): then :meth:`put_if` is a compare-and-swap across hosts."""
        return self.protocol in _S3_PROTOCOLS

    def etag(self) -> str | None:
        """The ETag of the object here (None: no object); for :meth:`put_if`."""
        fs, path = self.fs, self.path
        fs.invalidate_cache(path)
        try:
            tag = fs.info(path).get("ETag")
        except FileNotFoundError:
            return None
        return str(tag) if tag else None

    def put_if(self, data: bytes, *, etag: str | None) -> None:
        """Write ``data`` here only if the object is still the one with ``etag`` (None: only
        if there is none), in one conditional PUT.

        Raises:
            PreconditionError: the object changed (or appeared) since ``etag`` was read.
            ValueError: the store has no conditional writes (:attr:`conditional`).
        """
        if not self.conditional:
            raise ValueError(f"{self}: this store has no conditional writes")
        fs, path = self.fs, self.path
        try:
            if etag is None:
                fs.pipe_file(path, data, mode="create")
            else:
                fs.pipe_file(path, data, IfMatch=etag)
        except FileExistsError as e:
            raise PreconditionError(f"{self} appeared meanwhile") from e
        except OSError as e:
            if "pre-condition" not in str(e).lower() and "precondition" not in str(e).lower():
                raise
            raise PreconditionError(f"{self} changed meanwhile") from e
        finally:
            fs.invalidate_cache(path)


class PreconditionError(Exception):
    """A conditional write found the object changed since it was read (another writer)."""


#: In the name of a temp file: ``.NAME.tmp-TOKEN``.
TEMP_MARK = ".tmp-"


class TempFile:
    """A temp file being written: its path, and the open handle whose flock marks it live."""

    def __init__(self, path: str, handle: IO[bytes]) -> None:
        self.path, self._handle = path, handle

    def unlock(self) -> None:
        """Close the handle (releasing the flock); the file stays."""
        self._handle.close()


@contextmanager
def temp_copy(path: str, local: str | None, data: bytes | None = None) -> Iterator[TempFile]:
    """A fsynced copy of ``local`` (or ``data``) at a temp name beside ``path``, locked.

    The temp file stays flock-ed until :meth:`TempFile.unlock`, which marks it as live: a later
    publish removes only temp files whose lock it can take (their writer died, e.g. killed).
    The temp file is removed on exit unless it was renamed away.

    Where the filesystem can (Linux ``O_TMPFILE``), the bytes are written to a file without a
    name, locked from its first instant, and linked in as the temp file only once complete and
    fsynced: a writer killed mid-copy leaves nothing in the folder. Elsewhere the file is created
    under a ``.new-`` name, locked, renamed to its temp name, then written.
    """
    parent, name = posixpath.split(path)
    token = secrets.token_hex(6)
    tmp = posixpath.join(parent, f".{name}{TEMP_MARK}{token}")
    anonymous = _anonymous_file(parent)
    if anonymous is not None:
        out = os.fdopen(anonymous, "wb")
        fresh = None
    else:
        # Created under another name and locked before it gets its temp name, so a temp file
        # whose lock can be taken is always a dead writer's.
        fresh = posixpath.join(parent, f".{name}.new-{token}")
        # Exclusive: a name planted beside the destination (a symlink, a hard link) is refused.
        out = os.fdopen(create_exclusive(fresh, 0o644), "wb")
    try:
        flock(out.fileno())
        if fresh is not None:
            os.rename(fresh, tmp)
        src: IO[bytes]
        with open(local, "rb") if local else io.BytesIO(data or b"") as src:
            while block := src.read(CHUNK):
                out.write(block)
        out.flush()
        os.fsync(out.fileno())
        if fresh is None:
            _link_in(out.fileno(), tmp)
        yield TempFile(tmp, out)
    finally:
        out.close()
        for leftover in (fresh, tmp):
            if leftover is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)


def _link_in(fd: int, path: str) -> None:
    """Give the anonymous file open at ``fd`` the name ``path``, which must be new.

    ``linkat`` with ``AT_SYMLINK_FOLLOW`` on ``/proc/self/fd/N`` (a dir fd makes CPython call
    ``linkat`` rather than ``link``, which would link the magic link itself); it never follows
    or replaces ``path``: a planted name fails with EEXIST.
    """
    proc = os.open("/proc/self/fd", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _anonymous_file(parent: str) -> int | None:
    """A new file without a name in ``parent`` (``O_TMPFILE``), or None where that is missing."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = os.open(parent or ".", flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None  # this filesystem (or kernel) has no O_TMPFILE
        raise
    return fd  # its mode is 0o644 less the umask, as for any new file
