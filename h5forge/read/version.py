"""Which file a reader opens: a URL as given, or a version of an asset pinned once.

:class:`H5ImageDataset <h5forge.read.dataset.H5ImageDataset>` resolves ``version=`` here, once,
in the process that constructs it; what it keeps (and pickles to DataLoader workers) is the
version's own file, ``BASE/v/<16 hex>/NAME.h5``, which is never written over. A worker therefore
never reads the pointer: when a new version is published mid-epoch, every sample of the epoch
still comes from the version the dataset was opened at.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from h5forge.asset.open import url_to_fs
from h5forge.errors import IntegrityError
from h5forge.publish.manifest import read_manifest
from h5forge.publish.versions import KEY_HEX, asset_base, resolve_version
from h5forge.redact import redact_url

__all__ = ["hint_versions", "pin_version"]


def pin_version(
    url: str, version: str | None, storage_options: dict[str, Any] | None
) -> tuple[str, str]:
    """``(file URL, full sha256)`` of ``version`` of the asset at ``url``; ``(url, "")`` for None.

    ``latest`` costs one read of the pointer (it names the full sha256). A prefix costs an
    existence check of the version's file and one read of its manifest, whose sha256 must
    start with the version's key (the manifest is untrusted) and with the whole prefix.

    Raises:
        FileNotFoundError: no pointer (``latest``), or no version with this prefix.
        IntegrityError: the version's manifest names a sha256 outside the version's key.
        ValueError: ``version`` is not None, ``latest`` or 16-64 lower-case hex digits.
    """
    if version is None:
        return url, ""
    if not isinstance(version, str):
        raise ValueError(
            f"version={version!r} must be 'latest', a sha256 prefix of 16-64 hex digits, or None"
        )
    found, sha = resolve_version(url, version, storage_options=storage_options)
    if version == "latest":
        return found, sha
    recorded = read_manifest(found, storage_options=storage_options)["sha256"]
    if not recorded.startswith(version[:KEY_HEX]):
        raise IntegrityError(
            f"{redact_url(found)}: its manifest names sha256 {recorded}, which is not a "
            f"version with key {version[:KEY_HEX]}; the version folder is damaged — "
            "publish the version again"
        )
    if not recorded.startswith(version):
        raise FileNotFoundError(
            f"no version {version} of {redact_url(asset_base(url))}: the version with key "
            f"{version[:KEY_HEX]} has sha256 {recorded}"
        )
    return found, recorded


@contextlib.contextmanager
def hint_versions(
    url: str, version: str | None, storage_options: dict[str, Any] | None
) -> Iterator[None]:
    """Reword the failed open of an asset's base (no ``.h5``, no file there): name the fix.

    Costs nothing unless the open fails: a missing object, or a folder (the base of a local
    asset holds its ``v/`` folder), is then reported with ``version="latest"`` as the fix.
    """
    try:
        yield
    except (FileNotFoundError, IntegrityError) as e:
        if version is not None or url.rstrip("/").endswith(".h5"):
            raise
        if isinstance(e, IntegrityError):
            fs, path = url_to_fs(url, storage_options)
            if not fs.isdir(path):
                raise
        raise FileNotFoundError(
            f"no file at {redact_url(url)}: to read the latest published version of the asset "
            f'at this base, open it with version="latest" (or version="<sha256 prefix>")'
        ) from e
