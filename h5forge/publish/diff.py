"""What changed between two files (two versions of an asset), from their indexes alone.

Each file's index is read through :func:`h5forge.asset.open.open_h5` and checked by
:func:`h5forge.asset.index.load_index`; the samples are matched by ``/paths`` and compared by
``/digests``. No sample byte is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import load_index, repeated_paths
from h5forge.asset.open import open_h5
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.read.version import resolve_asset

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
    """``({path: digest}, classes, config_sha256)`` of the sealed file at ``where``."""
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


def diff_files(a: Location, b: Location) -> FileDiff:
    """Compare the sealed files at ``a`` and ``b``.

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
    (:func:`h5forge.read.version.resolve_asset`).

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
    return where.with_url(resolve_asset(where, version)[0])
