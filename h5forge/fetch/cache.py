"""The content-addressed download cache of ``fetch``.

An entry is a folder named by sha256(canonical URL, expected digest) holding ``blob`` and
``meta.json``. The canonical URL carries no credentials or signatures, so a re-signed URL of the
same object finds the same entry. Only entries fetched with an expected digest are reused, and
only after the blob is re-hashed: a corrupt cache can cost a download, never a wrong dataset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from h5forge.errors import ChecksumError
from h5forge.fetch.staging import exclusive
from h5forge.files import create_exclusive, replace_file
from h5forge.location import MAX_CACHE_RECORD_BYTES, Location
from h5forge.redact import canonical_url

__all__ = ["cached_download", "check_digest", "create_part"]

log = logging.getLogger("h5forge.fetch.sources")


def check_digest(expected: str, actual: str, shown: str) -> None:
    """Raise ChecksumError naming both digests when ``expected`` is set and differs."""
    if expected and actual != expected:
        raise ChecksumError(
            f"sha256 mismatch for {shown!r}: expected {expected}, got {actual}; nothing was "
            "extracted and any download was deleted — check the URL and the published checksum",
            [f"sha256 expected={expected} actual={actual}"],
        )


def create_part(part: Path) -> int:
    """Create the new download file ``part`` and return its descriptor (see
    :func:`cached_download`): exclusively, so never through a link planted in the cache.

    Raises:
        FileExistsError: something already has that name.
    """
    try:
        return create_exclusive(part, 0o666)
    except FileExistsError as exc:
        raise FileExistsError(
            f"download file {str(part)!r} already exists (perhaps as a link); "
            "refusing to write through it — remove it and retry"
        ) from exc


def cached_download(
    cache: Path,
    url: str,
    expected: str,
    shown: str,
    get: Callable[[Path], tuple[str, int]],
) -> tuple[Path, str, bool]:
    """Return ``(blob path, sha256, hit)``, calling ``get(part_path)`` only on a miss.

    ``get`` creates the new file ``part_path`` exclusively (``O_EXCL | O_NOFOLLOW``: never
    through a link planted in the cache), writes it and returns ``(sha256, size)``. A digest
    mismatch deletes the partial download and raises :class:`ChecksumError`; the entry is
    published (renamed) only after the check passes, with ``meta.json`` written last.
    """
    key = hashlib.sha256(f"{canonical_url(url)}\n{expected}".encode()).hexdigest()[:40]
    entry = cache / key
    blob = entry / "blob"
    if _hit(entry, expected):
        return blob, expected, True
    # Downloads of one entry take turns (a second one then finds the first's blob), and the
    # partial downloads of dead ones (killed: nothing unlinked them) are removed.
    with exclusive(entry):
        if _hit(entry, expected):
            return blob, expected, True
        entry.mkdir(parents=True, exist_ok=True)
        for stale in [
            *entry.glob("blob.part-*"),
            *entry.glob("meta.json.tmp-*"),
            *entry.glob(".meta.json.tmp-*"),
        ]:
            log.info("removing %s, left by an interrupted download", stale)
            stale.unlink(missing_ok=True)
        part = entry / f"blob.part-{secrets.token_hex(6)}"
        try:
            digest, size = get(part)
            check_digest(expected, digest, shown)
            os.replace(part, blob)
        finally:
            part.unlink(missing_ok=True)
        replace_file(
            entry / "meta.json",
            json.dumps({"source_url": shown, "sha256": digest, "bytes": size}).encode(),
        )
    return blob, digest, False


def _hit(entry: Path, expected: str) -> bool:
    blob, meta = entry / "blob", entry / "meta.json"
    if not (expected and blob.is_file() and meta.is_file()):
        return False
    try:
        record = Location.of(meta).read_json(
            limit=MAX_CACHE_RECORD_BYTES, what="download-cache record"
        )
        recorded = record.get("sha256") if isinstance(record, dict) else None
    except (OSError, ValueError):  # gone, not a regular file, not JSON h5forge wrote
        recorded = None
    if recorded == expected == Location.of(blob).sha256():
        log.info("cache hit: %s", entry)
        return True
    log.warning("cache entry %s does not match sha256 %s; downloading again", entry, expected)
    return False
