"""What changed between two files (two versions of an asset), from their indexes alone.

Each file's index is read through :func:`h5forge.asset.open.open_h5` and checked by
:func:`h5forge.asset.index.load_index`; the samples are matched by ``/paths`` and compared by
``/digests``. No sample byte is read. A sharded version (docs/FORMAT.md, "Sharded versions")
is its manifest's shards: each shard's index, checked against its entry (its rows, and its
index and attributes recomputed to the entry's ``metadata_sha256``), its live rows only. So any
two versions compare, single-file or sharded.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import load_index, repeated_paths
from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.errors import IntegrityError, StoreError
from h5forge.location import Location
from h5forge.publish.manifest import SHARDS_DIR, ShardEntry, load_manifest
from h5forge.publish.named import is_manifest, resolve_named
from h5forge.publish.versions import KEY_HEX, check_tree
from h5forge.redact import redact_url

__all__ = ["FileDiff", "diff_files", "resolve_pair"]


@dataclass(frozen=True)
class FileDiff:
    """How file ``b`` differs from file ``a``. URLs are redacted.

    Attributes:
        samples: the number of samples of ``a`` and of ``b``.
        classes_added, classes_removed: class names in ``b`` only, in ``a`` only.
        config_changed: their ``config_sha256`` differ.
        added, removed: sample paths in ``b`` only, in ``a`` only.
        replaced: paths in both whose digest differs.
        same: paths in both with the same digest.
    """

    a: str
    b: str
    samples: tuple[int, int]
    classes_added: tuple[str, ...]
    classes_removed: tuple[str, ...]
    config_changed: bool
    added: int
    removed: int
    replaced: int
    same: int


def _read(where: Location) -> tuple[dict[str, bytes], Any, str]:
    """``({path: digest}, classes, config_sha256)`` of the sealed file (or the sharded
    version's manifest) at ``where``."""
    if is_manifest(where.url):
        return _read_sharded(where)
    with open_h5(where) as h5:
        index = load_index(h5, where=str(where))
        n = int(index.labels.shape[0])
        paths = h5[fmt.PATHS].asstr()[:n]
        digests = np.asarray(h5[fmt.DIGESTS][:n], np.uint8)
        config = str(h5.attrs[fmt.A_CONFIG_SHA256])
    repeats = repeated_paths(paths.tolist())
    if repeats:  # samples are matched by path: verify refuses such a file too
        raise IntegrityError(f"{where}: a sample path is not unique", repeats)
    return {p: d.tobytes() for p, d in zip(paths, digests, strict=True)}, index.classes, config


def _read_sharded(where: Location) -> tuple[dict[str, bytes], Any, str]:
    """:func:`_read` of a sharded version: ``where`` is ``BASE/v/<16 hex>/NAME.version.json``;
    its bytes must hash to that key, and each shard's index to its entry's metadata digest."""
    folder = posixpath.dirname(where.url.split("?", 1)[0])
    key, base = posixpath.basename(folder), posixpath.dirname(posixpath.dirname(folder))
    try:
        manifest, _ = load_manifest(where, key)
    except IntegrityError:
        raise
    except ValueError as e:  # a damaged version, not a usage error
        raise IntegrityError(f"{where}: {e}") from e
    root = where.with_url(base)
    paths: list[str] = []
    digests: list[np.ndarray] = []
    for entry in manifest.shards:
        shard_paths, shard_digests = _shard_index(root, entry)
        live = entry.live_rows()
        paths.extend(shard_paths[live].tolist())
        digests.append(shard_digests[live])
    repeats = repeated_paths(paths)
    if repeats:
        raise IntegrityError(f"{where}: a sample path is not unique", repeats)
    rows = np.concatenate(digests) if digests else np.zeros((0, fmt.DIGEST_SIZE), np.uint8)
    found = {p: d.tobytes() for p, d in zip(paths, rows, strict=True)}
    return found, manifest.classes, manifest.config_sha256


def _shard_index(root: Location, entry: ShardEntry) -> tuple[np.ndarray, np.ndarray]:
    """``(/paths, /digests)`` of the shard ``entry`` names under ``root`` (the asset's base),
    once its index is the one the entry recorded."""
    name = f"{entry.sha256}.h5"
    check_tree(root, SHARDS_DIR, name)  # never a link, on a local store
    where = root.join(SHARDS_DIR, name)
    try:
        with open_h5(where) as h5:
            index = load_index(h5, where=str(where))
            n = int(index.labels.shape[0])
            digest = metadata_sha256(h5)
            paths = np.asarray(h5[fmt.PATHS].asstr()[:n], dtype=object)
            digests = np.asarray(h5[fmt.DIGESTS][:n], np.uint8)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{redact_url(where.url)}: shard {entry.sha256[:KEY_HEX]} of the version is missing; "
            "`h5forge verify` the version, and publish it again"
        ) from None
    except StoreError:  # a failed store is no damage
        raise
    except H5_DAMAGE as e:
        raise IntegrityError(f"{where}: the shard's index cannot be read ({e})") from e
    if digest != entry.metadata_sha256 or n != entry.samples:
        raise IntegrityError(
            f"{where}: the shard is not the one its version names (its index hashes to "
            f"{digest} over {n} rows, the manifest records {entry.metadata_sha256} over "
            f"{entry.samples}); `h5forge verify` the version"
        )
    return paths, digests


def diff_files(a: Location, b: Location) -> FileDiff:
    """Compare the sealed files (or sharded versions' manifests) at ``a`` and ``b``.

    Raises:
        FileNotFoundError: nothing at ``a`` or ``b``.
        IntegrityError, UnsealedFileError: one is damaged or not a sealed h5forge file (a
            file that lists a sample path twice included, as ``verify`` refuses it).
    """
    old, old_classes, old_config = _read(a)
    new, new_classes, new_config = _read(b)
    both = old.keys() & new.keys()
    replaced = sum(1 for p in both if old[p] != new[p])
    return FileDiff(
        a=str(a),
        b=str(b),
        samples=(len(old), len(new)),
        classes_added=tuple(c for c in new_classes if c not in set(old_classes)),
        classes_removed=tuple(c for c in old_classes if c not in set(new_classes)),
        config_changed=old_config != new_config,
        added=len(new.keys() - old.keys()),
        removed=len(old.keys() - new.keys()),
        replaced=replaced,
        same=len(both) - replaced,
    )


def resolve_pair(first: Location, rest: Sequence[str]) -> tuple[Location, Location]:
    """The two files ``[first, *rest]`` name: ``[A, B]`` (files, or names assets were published
    to; ``B`` is on the store of ``A``, with its options) or ``[BASE, V1, V2]`` (each version
    ``latest`` or a sha256 prefix of 16-64 hex digits), resolved as every reader resolves them
    (:func:`h5forge.read.version.resolve_asset`; a sharded version is its manifest,
    :func:`h5forge.publish.named.resolve_named`).

    Raises:
        ValueError: not two or three references, or a version is not of that form.
        FileNotFoundError: no such file, asset or version.
        IntegrityError: a version's sidecar contradicts its key.
    """
    if len(rest) == 1:
        b = first.with_url(rest[0])
        return _resolved(first, None), _resolved(b, None)
    if len(rest) == 2:
        v1, v2 = rest
        return _resolved(first, v1), _resolved(first, v2)
    raise ValueError(
        f"diff takes A B (two file URLs) or BASE V1 V2 (an asset and two versions), not "
        f"{1 + len(rest)} arguments"
    )


def _resolved(where: Location, version: str | None) -> Location:
    return where.with_url(resolve_named(where, version).url)
