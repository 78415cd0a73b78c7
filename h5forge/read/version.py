"""Which file a reader opens: a URL as given, or a version of an asset pinned once.

:class:`H5ImageDataset <h5forge.read.dataset.H5ImageDataset>` resolves ``version=`` here, once,
in the process that constructs it; what it keeps (and pickles to DataLoader workers) is the
version's own file, ``BASE/v/<16 hex>/NAME.h5``, which is never written over. A worker therefore
never reads the pointer: when a new version is published mid-epoch, every sample of the epoch
still comes from the version the dataset was opened at.

Names round-trip: the name an asset was built or published to (``DEST.h5``, or its base
``DEST``) opens it. Without ``version``, a file at that name is read as it is; when there is
none, the asset's latest version is (:func:`latest_instead`, the resolution of
``version="latest"``). The command line (``h5forge verify``, ``inspect``, their ``--version``)
resolves names with :func:`resolve_asset`, the same functions.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.errors import IntegrityError
from h5forge.location import MAX_MANIFEST_BYTES, Location
from h5forge.publish.manifest import MANIFEST_SUFFIX
from h5forge.publish.sidecar import load_sidecar, read_sidecar
from h5forge.publish.versions import (
    KEY_HEX,
    asset_base,
    parse_version,
    pointer_url,
    resolve_version,
    version_url,
)
from h5forge.read.cache import FileCache
from h5forge.redact import redact_url

__all__ = [
    "cached_version",
    "check_version_file",
    "latest_instead",
    "open_named",
    "pin_version",
    "resolve_asset",
]


def pin_version(where: Location, version: str | None) -> tuple[str, str]:
    """``(file URL, full sha256)`` of ``version`` of the asset at ``where``; ``(URL, "")`` for
    None.

    ``latest`` costs one read of the pointer (it names the full sha256). A prefix costs an
    existence check of the version's file and one read of its sidecar, whose sha256 must
    start with the version's key (the sidecar is untrusted) and with the whole prefix.

    Raises:
        FileNotFoundError: no pointer (``latest``), or no version with this prefix.
        IntegrityError: the version's sidecar names a sha256 outside the version's key.
        ValueError: ``version`` is not None and not what
            :func:`h5forge.publish.versions.parse_version` accepts.
    """
    url = where.url
    if version is None:
        return url, ""
    version = parse_version(version)
    found, sha = resolve_version(where, version)
    if version == "latest":
        return found, sha
    if found.endswith(MANIFEST_SUFFIX):  # sharded: the manifest's bytes name the version
        data = where.with_url(found).read_bytes(limit=MAX_MANIFEST_BYTES, what="version manifest")
        recorded = hashlib.sha256(data).hexdigest()
        if not recorded.startswith(version):
            raise FileNotFoundError(
                f"no version {version} of {redact_url(asset_base(url))}: the version with key "
                f"{version[:KEY_HEX]} has sha256 {recorded}"
            )
        return found, recorded
    recorded = read_sidecar(where.with_url(found))["sha256"]
    if not recorded.startswith(version[:KEY_HEX]):
        raise IntegrityError(
            f"{redact_url(found)}: its sidecar names sha256 {recorded}, which is not a "
            f"version with key {version[:KEY_HEX]}; the version folder is damaged — "
            "publish the version again"
        )
    if not recorded.startswith(version):
        raise FileNotFoundError(
            f"no version {version} of {redact_url(asset_base(url))}: the version with key "
            f"{version[:KEY_HEX]} has sha256 {recorded}"
        )
    return found, recorded


def check_version_file(where: Location, sha256: str) -> None:
    """A local version's file is the one its sidecar (and so its pointer) recorded.

    A version's file is named by its sha256, but a name proves nothing: another valid asset
    copied over it would be read under the old version's sha256, and reused by an incremental
    build. Hashing the whole file at every open costs a full read, so an open checks what is
    cheap and still tells assets apart: the sidecar names this ``sha256``, the file has the
    size it recorded, and its index and attributes hash (recomputed, never the attribute taken
    on trust) to the ``metadata_sha256`` it recorded (sidecars written before 0.2 lack it: then
    size alone). The full sha256 is checked where the bytes are taken, before reuse
    (:func:`h5forge.publish.lineage.reuse_previous`). Remote versions are checked by the
    verified cache, or by the reader's digests.

    Raises:
        IntegrityError: no sidecar, or the file is not the version it recorded.
    """
    shown, key = redact_url(where.url), sha256[:KEY_HEX]
    sidecar = load_sidecar(where.sidecar)
    if sidecar is None or sidecar["sha256"] != sha256:
        found = "no sidecar" if sidecar is None else f"a sidecar naming {sidecar['sha256']}"
        raise IntegrityError(
            f"{shown}: version {key} has {found} beside its file, not one naming its sha256 "
            f"{sha256}: the version folder is damaged; publish the version again"
        )
    replaced = (
        f"{shown} is not the file version {key} published (its pointer and sidecar name "
        f"sha256 {sha256}): it was replaced by another file; publish the version again, "
        "or delete the version folder"
    )
    size = os.stat(where.path).st_size
    if size != sidecar["bytes"]:
        raise IntegrityError(
            f"{replaced} (it is {size} bytes, the sidecar says {sidecar['bytes']})"
        )
    recorded = sidecar.get(fmt.A_METADATA_SHA256)
    if not recorded:
        return
    try:
        with open_h5(where) as h5:
            found = metadata_sha256(h5)
    except H5_DAMAGE as e:
        raise IntegrityError(f"{replaced} ({type(e).__name__}: {e})") from None
    if found != recorded:
        raise IntegrityError(
            f"{replaced} (its index and attributes hash to {found}, the sidecar records {recorded})"
        )


def latest_instead(where: Location, error: Exception) -> tuple[str, str]:
    """``(file URL, full sha256)`` of the latest version of the asset ``where`` names, once
    opening ``where`` itself failed with ``error`` (no file there, or the folder of a local base).

    Raises:
        error: ``url`` is a file that failed for another reason, or names no asset.
        FileNotFoundError: the asset has no published version either; the message says both.
    """
    # Only a local base is a folder (an object store has no folders to open); elsewhere the
    # open read a file, and a damaged one is not an asset's name. (``isdir`` of an HTTP URL
    # would GET the whole file to look for links in it.)
    if isinstance(error, IntegrityError) and not (where.is_local and where.fs.isdir(where.path)):
        raise error
    url = where.url
    try:
        return pin_version(where, "latest")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no file at {redact_url(url)}, and no published version of that asset "
            f"({redact_url(pointer_url(url))} is not there): check the name; an asset built "
            "with --versioned is read by the name it was built to, or by its base"
        ) from error
    except ValueError:  # names no asset (a bare bucket): the open's own error says more
        raise error from None


def cached_version(
    where: Location, version: str | None, cache: FileCache | None
) -> tuple[str, str] | None:
    """``(file URL, sha256)`` of ``version`` when it is a full sha256 and the verified ``cache``
    holds that version of a remote asset (its file or its manifest, hashed to it): it is opened
    from there asking the server nothing, not even whether the version is still published (a
    version's bytes never change; its sha256 is what was asked for). None otherwise: resolve it
    with :func:`open_named`."""
    if cache is None or not isinstance(version, str) or len(version) != 64 or where.is_local:
        return None
    kind = cache.cached_version(version)
    if kind is None:
        return None
    return version_url(where.url, version, kind), version


def resolve_asset(where: Location, version: str | None) -> tuple[str, str]:
    """``(file URL, full sha256 or "")`` that ``where`` and ``version`` name, before opening it.

    ``version`` as :func:`pin_version` takes it; None: the file at ``url`` when there is one,
    else the asset's latest version (:func:`latest_instead`). One existence check more than
    :func:`open_named`, which only looks for a version once the open failed.

    Raises:
        FileNotFoundError: no file, pointer or version by that name (the message says which).
        IntegrityError, ValueError: as :func:`pin_version`.
    """
    if version is not None:
        return pin_version(where, version)
    if where.ask("what it is", "isfile", where.path):
        return where.url, ""
    return latest_instead(where, FileNotFoundError(f"no file at {where.url}"))


def open_named(
    where: Location, version: str | None, opener: Callable[[str, str], object]
) -> tuple[str, str]:
    """Open what ``where`` and ``version`` name with ``opener(file URL, sha256)``; return those.

    Costs nothing more than the open when ``where`` names a file: only when that open fails
    without ``version`` is the asset's latest version looked for (:func:`latest_instead`).
    A remote name that does not end in ``.h5`` is read as a base first (its ``latest``
    pointer: one request, where trying it as a file first costs three), and as a file when it
    has no pointer.

    Raises:
        what :func:`pin_version`, :func:`latest_instead` and ``opener`` raise.
    """
    if version is None and not where.is_local and not where.path.endswith(".h5"):
        try:
            found = pin_version(where, "latest")
        except (FileNotFoundError, ValueError):
            pass  # no pointer: a file by that name, or nothing (the open below says which)
        else:
            opener(*found)
            return found
    found = pin_version(where, version)
    try:
        opener(*found)
    except (FileNotFoundError, IntegrityError) as e:
        if version is not None:
            raise
        found = latest_instead(where, e)
        opener(*found)
    return found
