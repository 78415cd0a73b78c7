"""Immutable, content-addressed versions of an asset and the ``NAME.latest.json`` pointer.

An asset named by its base URL ``BASE`` (``s3://bucket/flowers``; a destination
``s3://bucket/flowers.h5`` names the same asset) keeps each version under a key derived from
the file's sha256, never written over::

    BASE/v/<first 16 hex of sha256>/NAME.h5            the file
    BASE/v/<first 16 hex of sha256>/NAME.h5.manifest.json
    BASE.latest.json                                   the pointer, written last

A sharded version (:mod:`h5forge.publish.manifest`) is a manifest instead of a file,
``BASE/v/<first 16 hex of the manifest's sha256>/NAME.version.json``, over shard files under
``BASE/shards/``; its pointer has format version 2 and ``kind: "sharded"``, which an h5forge
that reads only version 1 refuses ("upgrade h5forge") instead of looking for a file that is not
there. A single-file version's pointer stays format version 1, readable by every h5forge.

The pointer is the commit marker for "latest": one small JSON object naming the version's full
sha256, written in one step (temp file, fsync and rename on a local disk; one PUT on an object
store). A pointer is untrusted input like any file: it is size-bounded, and the version's path
is recomputed from its name and digest, never taken from the pointer, so a pointer can only
ever name a version of its own asset.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from h5forge.errors import BusyError, UnsafePathError
from h5forge.location import MAX_POINTER_BYTES, Location, PreconditionError
from h5forge.locks import folder_lock
from h5forge.redact import redact_url

__all__ = [
    "Guard",
    "KINDS",
    "MAX_SHARD_FILES",
    "MAX_VERSIONS",
    "POINTER_FORMAT",
    "POINTER_SUFFIX",
    "Pointer",
    "VERSION_FORM",
    "asset_base",
    "asset_lock",
    "check_tree",
    "check_version_tree",
    "guard_pointer",
    "parse_version",
    "pointer_body",
    "pointer_url",
    "read_pointer",
    "resolve_version",
    "version_key",
    "version_url",
    "write_pointer",
]

POINTER_SUFFIX = ".latest.json"
POINTER_FORMAT = "h5forge-latest"
_POINTER_VERSION = 1  # a single-file version's pointer
_SHARDED_POINTER_VERSION = 2  # a sharded version's pointer (kind "sharded")
#: What a pointer's ``kind`` may be: a version that is one file, or a manifest of shards.
KINDS = ("file", "sharded")
KEY_HEX = 16  # hex digits of the sha256 in a version's key: 64 bits, no collision in practice
MAX_VERSIONS = 10_000  # entries under BASE/v/ read at most; more is not an asset we keep
#: Entries under ``BASE/shards/`` listed at most (kept versions of up to 200,000 shards each).
MAX_SHARD_FILES = 2_000_000
# fullmatch everywhere: ``$`` would also match before a trailing newline ("...\n").
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[0-9a-f]{16,64}")
#: The accepted form of a version string, as every command and ``version=`` says it.
VERSION_FORM = "'latest' or the first 16-64 lower-case hex digits of a version's sha256"
_NAME = re.compile(r"^[^/\x00]{1,255}$")


def asset_base(url: str) -> str:
    """The asset's base URL: ``url`` without a trailing ``.h5`` (or a trailing slash)."""
    base = str(url).rstrip("/")
    if base.endswith(".h5"):
        base = base[: -len(".h5")]
    name = posixpath.basename(base)
    _, sep, rest = base.partition("://")
    if (sep and "/" not in rest.strip("/")) or not _NAME.fullmatch(name) or name in (".", ".."):
        # A bare bucket (s3://bucket) names no asset: its pointer would be another bucket.
        raise ValueError(
            f"{redact_url(str(url))!r} names no asset: its last part must be a file name "
            "(such as s3://bucket/flowers or s3://bucket/flowers.h5)"
        )
    return base


def parse_version(version: object) -> str:
    """``version`` itself when it is ``latest`` or a sha256 prefix of 16-64 lower-case hex
    digits: the one parser of version strings (the reader, ``versions``, ``diff``, the
    multi-asset list and every command's ``--version`` refuse exactly what it refuses).

    Raises:
        ValueError: anything else (upper case, spaces, a newline, ``LATEST``, a non-string),
            named, with the accepted form.
    """
    if version == "latest" or (isinstance(version, str) and _PREFIX.fullmatch(version)):
        return str(version)
    raise ValueError(f"version {version!r:.80} must be {VERSION_FORM} (see `h5forge versions URL`)")


def version_key(name: str, sha256: str) -> str:
    """``v/<16 hex>/NAME.h5``: where the version with this sha256 lives under the base.

    Raises:
        ValueError: ``sha256`` is not 16-64 lower-case hex digits (a key never leaves ``v/``).
    """
    if not _PREFIX.fullmatch(sha256):
        raise ValueError(f"sha256 {sha256!r} must be 16-64 lower-case hex digits")
    return f"v/{sha256[:KEY_HEX]}/{name}.h5"


def version_url(url: str, sha256: str, kind: str = "file") -> str:
    """The URL of the version of the asset at ``url`` whose file (``kind="file"``) or manifest
    (``kind="sharded"``) has this sha256."""
    from h5forge.publish.manifest import manifest_key

    base = asset_base(url)
    name = posixpath.basename(base)
    if kind == "sharded":
        return f"{base}/{manifest_key(name, sha256)}"
    return f"{base}/{version_key(name, sha256)}"


def pointer_url(url: str) -> str:
    """``BASE.latest.json``: the pointer of the asset at ``url``."""
    return asset_base(url) + POINTER_SUFFIX


@dataclass(frozen=True)
class Pointer:
    """What ``NAME.latest.json`` says: the latest version of one asset.

    Attributes:
        url: the version's file, or its manifest for a sharded version (recomputed from the
            asset's base, ``sha256`` and ``kind``).
        sha256: the version file's (or manifest's) full sha256 (hex).
        published_at: when the pointer was written (ISO 8601, UTC).
        parent: the sha256 of the version it replaced as latest, "" for the first.
        kind: ``"file"`` or ``"sharded"``.
    """

    url: str
    sha256: str
    published_at: str
    parent: str
    kind: str = "file"


@dataclass(frozen=True)
class Guard:
    """The pointer as a publisher read it, and what a conditional write compares against.

    Attributes:
        pointer: what it said (None: the asset had none).
        etag: on a store with conditional writes, the ETag of the pointer object read (None:
            no object); unused elsewhere.
        conditional: the store has conditional writes (S3): the pointer moves only if it is
            still this one, whichever host moved it.
    """

    pointer: Pointer | None
    etag: str | None = None
    conditional: bool = False


def guard_pointer(asset: Location, *, tries: int = 5) -> Guard:
    """The pointer now, with (on S3) the ETag of the very object read: the tag is taken before
    and after the read, and the read is repeated while they differ.

    Raises:
        BusyError: the pointer changed under every one of ``tries`` reads (writers racing).
        ValueError: as :func:`read_pointer`.
    """
    target = asset.with_url(pointer_url(asset.url))
    if not target.conditional:
        return Guard(read_pointer(asset))
    for _ in range(tries):
        before = target.etag()
        pointer = read_pointer(asset)
        after = target.etag()
        if before == after and (pointer is None) == (after is None):
            return Guard(pointer, after, conditional=True)
    raise BusyError(
        f"{redact_url(pointer_url(asset.url))} changed under each of {tries} reads: other "
        "builds are publishing this asset right now; run this one again later"
    )


def write_pointer(
    asset: Location,
    sha256: str,
    *,
    parent: str = "",
    kind: str = "file",
    guard: Guard | None = None,
) -> Pointer:
    """Make the version with this sha256 the latest of the asset at ``asset``, in one step;
    written last.

    The caller has published the version (file read back and sidecar written; or, sharded,
    every shard and the manifest) before calling. With ``guard`` (:func:`guard_pointer`, read
    before the caller decided) on a store with conditional writes, the pointer moves only if it
    is still the one read: a writer on another host that moved it meanwhile makes this one
    fail instead of being overwritten.

    Raises:
        BusyError: the pointer moved since ``guard`` was read (nothing was written).
    """
    body = pointer_body(asset, sha256, parent=parent, kind=kind)
    target = asset.with_url(pointer_url(asset.url))
    if guard is not None and guard.conditional:
        try:
            target.put_if(body, etag=guard.etag)
        except PreconditionError:
            was = guard.pointer.sha256[:KEY_HEX] if guard.pointer else "no version"
            raise BusyError(
                f"{redact_url(pointer_url(asset.url))} was moved by another writer after this "
                f"publish read it (it then named {was}): the pointer was left as that writer "
                "made it; run this build again to build on it"
            ) from None
    else:
        target.put(data=body)
    return _pointer(asset_base(asset.url), json.loads(body))


def pointer_body(asset: Location, sha256: str, *, parent: str = "", kind: str = "file") -> bytes:
    """The bytes of a pointer naming this version (format version 1 for a file, 2 sharded)."""
    if not _SHA256.fullmatch(sha256) or (parent and not _SHA256.fullmatch(parent)):
        raise ValueError(f"sha256 {sha256!r} / parent {parent!r} must be 64 lower-case hex digits")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} must be one of {KINDS}")
    base = asset_base(asset.url)
    body = {
        "format": POINTER_FORMAT,
        "format_version": _POINTER_VERSION if kind == "file" else _SHARDED_POINTER_VERSION,
        "name": posixpath.basename(base),
        "sha256": sha256,
        "path": version_url(base, sha256, kind)[len(base) + 1 :],
        "published_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "parent": parent,
        **({"kind": kind} if kind != "file" else {}),
    }
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def _pointer(base: str, body: dict[str, object]) -> Pointer:
    sha, kind = str(body["sha256"]), str(body.get("kind", "file"))
    published = body.get("published_at", "")
    return Pointer(
        url=version_url(base, sha, kind),
        sha256=sha,
        published_at=published if isinstance(published, str) else "",
        parent=str(body.get("parent", "")),
        kind=kind,
    )


def read_pointer(asset: Location) -> Pointer | None:
    """The latest version of the asset at ``asset``, from its pointer; None when it has none.

    Raises:
        ValueError: the pointer is larger than 64 KiB, not JSON, of another format, or names a
            digest that is not a sha256 (the message names the pointer and the fix).
    """
    base = asset_base(asset.url)
    target = asset.with_url(pointer_url(base))
    shown = str(target)
    try:
        # One ranged GET: no size lookup first (fs.open would add a HEAD, and could trust a
        # cached listing's stale size), and never more than the bound is read.
        body = target.read_json(limit=MAX_POINTER_BYTES, what="pointer")
    except FileNotFoundError:
        return None
    if not isinstance(body, dict) or body.get("format") != POINTER_FORMAT:
        raise ValueError(f"{shown} is not an h5forge pointer (format {POINTER_FORMAT!r})")
    version = body.get("format_version")
    if version not in (_POINTER_VERSION, _SHARDED_POINTER_VERSION) or isinstance(version, bool):
        raise ValueError(
            f"{shown} has pointer format version {version!r:.40}; this h5forge reads versions "
            f"{_POINTER_VERSION} and {_SHARDED_POINTER_VERSION}: upgrade h5forge"
        )
    kind = body.get("kind", "file")
    if (version == _SHARDED_POINTER_VERSION) != (kind == "sharded") or kind not in KINDS:
        raise ValueError(
            f"{shown}: kind {kind!r:.40} does not go with pointer format version {version}"
        )
    sha = body.get("sha256")
    parent = body.get("parent", "")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise ValueError(f"{shown}: sha256 {sha!r} is not 64 lower-case hex digits")
    if not isinstance(parent, str) or (parent and not _SHA256.fullmatch(parent)):
        raise ValueError(f"{shown}: parent {parent!r} is not a sha256")
    return _pointer(base, body)


def resolve_version(asset: Location, version: str) -> tuple[str, str]:
    """``(file URL, sha256 or prefix)`` of ``version`` (``latest`` or a sha256 prefix) of the
    asset at ``asset``.

    ``latest`` reads the pointer once; a prefix of at least 16 hex digits names the version
    whose key starts with it (its file need not be the latest).

    Raises:
        FileNotFoundError: the asset has no pointer (``latest``) or no such version.
        ValueError: ``version`` is neither ``latest`` nor 16-64 lower-case hex digits.
    """
    version = parse_version(version)
    url = asset.url
    if version == "latest":
        pointer = read_pointer(asset)
        if pointer is None:
            raise FileNotFoundError(
                f"no {redact_url(pointer_url(url))}: the asset has no published version; "
                "publish one, or open a file by its URL"
            )
        check_version_tree(asset, pointer.sha256, pointer.kind)
        return pointer.url, pointer.sha256
    for kind in KINDS:  # a version is a file or, sharded, a manifest under the same key
        found = version_url(url, version, kind)
        check_version_tree(asset, version, kind)
        file = asset.with_url(found)
        if file.ask("whether it exists", "exists", file.path):
            return found, version
    raise FileNotFoundError(f"no version {version} of {redact_url(asset_base(url))}")


def check_version_tree(asset: Location, sha256: str, kind: str = "file") -> None:
    """:func:`check_tree` down to the file (or, sharded, the manifest) of the version with
    this sha256 (or prefix)."""
    base = asset_base(asset.url)
    key = version_url(base, sha256, kind)[len(base) + 1 :]
    check_tree(asset.with_url(base), *key.split("/"))


def check_tree(base: Location, *names: str) -> None:
    """Refuse a link at any level of ``BASE/names...`` on a local store, ``BASE`` included.

    An asset's own tree is untrusted like any input: a link at ``BASE``, ``BASE/v`` or a
    version's folder would let retention delete, and a publish write, another asset's data, and
    a reader read it under this asset's name. Every level that exists must be a real folder
    (the last may be a regular file); a missing level ends the check (it is created by whoever
    writes it, as a folder). The folders above ``BASE`` are the user's own and may be links.
    Object stores have no links: nothing to check.

    Raises:
        UnsafePathError: a level is a symbolic link, or not a folder (the last: not a folder or
            a regular file); the message names it and the fix.
    """
    if not base.is_local:
        return
    levels = [base.path]
    for name in names:
        levels.append(os.path.join(levels[-1], name))
    for depth, level in enumerate(levels):
        try:
            st = os.lstat(level)
        except FileNotFoundError:
            return
        last = depth == len(levels) - 1
        if stat.S_ISLNK(st.st_mode):
            kind = "a symbolic link"
        elif stat.S_ISDIR(st.st_mode) or (last and stat.S_ISREG(st.st_mode)):
            continue
        else:
            kind = "not a folder" if not last else "neither a folder nor a regular file"
        raise UnsafePathError(
            f"{level!r} is {kind}, inside the asset {base.path!r}: h5forge never follows a "
            "link in an asset's own folders (it could read, overwrite or delete another "
            "asset's data); remove it, or publish the asset under a new name"
        )


_HELD = threading.local()  # the (device, inode) of each asset folder this thread has locked


@contextmanager
def asset_lock(asset: Location) -> Iterator[None]:
    """On a local store, publishers of one asset, and its garbage collection, take turns (a
    lock on its folder ``BASE``); object stores have no lock: there the deployment's concurrency
    limit serialises builds.

    Re-entrant within a thread (a publish runs retention under the lock it holds); another
    thread or process waits.
    """
    base = asset.with_url(asset_base(asset.url))
    if not base.is_local:
        yield
        return
    check_tree(base)  # BASE itself: makedirs and the lock would follow a link
    base.fs.makedirs(base.path, exist_ok=True)
    folder = os.stat(base.path)
    key = (folder.st_dev, folder.st_ino)
    held: set[tuple[int, int]] = _HELD.__dict__.setdefault("keys", set())
    if key in held:
        yield
        return
    with folder_lock(base.path):
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
