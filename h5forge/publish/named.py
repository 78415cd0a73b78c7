"""What a name and a version resolve to: a file, or a sharded version's manifest.

The commands that take an asset's name and ``--version`` (``verify``, ``diff``) and the verify
flow resolve it here: a sharded version (docs/FORMAT.md, "Sharded versions") is its manifest,
``BASE/v/<16 hex>/NAME.version.json``, checked by its own rules; anything else resolves as
every reader resolves it (:func:`h5forge.read.version.resolve_asset`).
"""

from __future__ import annotations

from typing import NamedTuple

from h5forge.location import Location
from h5forge.publish.manifest import MANIFEST_SUFFIX
from h5forge.publish.versions import parse_version, resolve_version
from h5forge.read.version import resolve_asset

__all__ = ["Named", "is_manifest", "resolve_named"]


class Named(NamedTuple):
    """A resolved name: ``url`` (the file, or the manifest), ``sha256`` (the version's full
    sha256, or the prefix given for a sharded one; "" for a file named by its URL) and
    ``kind`` (``"file"`` or ``"sharded"``)."""

    url: str
    sha256: str
    kind: str


def is_manifest(url: str) -> bool:
    """``url`` names a sharded version's manifest."""
    return url.split("?", 1)[0].endswith(MANIFEST_SUFFIX)


def resolve_named(where: Location, version: str | None) -> Named:
    """What ``where`` and ``version`` (None, ``latest`` or a sha256 prefix) name.

    Raises:
        FileNotFoundError, IntegrityError, ValueError: as
            :func:`h5forge.read.version.resolve_asset` raises them.
    """
    if version is not None:
        version = parse_version(version)
        url, sha = resolve_version(where, version)  # a file or a manifest, by its key
        if is_manifest(url):
            return Named(url, sha, "sharded")
    url, sha = resolve_asset(where, version)
    return Named(url, sha, "sharded" if is_manifest(url) else "file")
