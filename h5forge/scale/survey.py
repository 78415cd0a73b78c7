"""Survey the parts of a merge: headers, counts, quarantine lists, sidecars; refuse a mix.

Every part is opened once (HDF5 header and index, a local or remote URL) before anything is
written, so a mix of builds, an unsealed part or too many bad inputs fail the merge up front.
A part with a sidecar (``url + ".manifest.json"``, written last by
:func:`h5forge.publish.storage.publish`) is to be checked by its whole file's sha256: the hash of a
local one starts here, on :class:`h5forge.scale.file_check.FileChecks`' threads, while the others
are surveyed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import check_labels, load_index
from h5forge.asset.open import open_h5
from h5forge.location import Location
from h5forge.publish.sidecar import read_sidecar, sidecar_url
from h5forge.scale.file_check import Expected, FileChecks, FileIdentity

__all__ = ["Part", "survey"]

log = logging.getLogger(__name__)

# Root attributes every part of one build must share.
_SAME = (
    fmt.A_LAYOUT,
    fmt.A_STORAGE,
    fmt.A_ENCODING,
    fmt.A_MODE,
    fmt.A_COMPRESSION,
    fmt.A_CONFIG_JSON,
)


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Part:
    """What the merge needs to know about one part before copying it."""

    where: Location
    n: int
    attrs: dict[str, str]
    classes: tuple[str, ...]
    split_names: tuple[str, ...]
    image_shape: tuple[int, ...]  # (H, W, C) for array storage, (B,) for blob storage
    filters: tuple[int, ...]  # HDF5 filter ids on /images
    expected: Expected | None  # its sidecar: the whole file is checked against it
    identity: FileIdentity | None  # of a local part when it was surveyed

    @property
    def url(self) -> str:
        """The part's URL as given, for messages."""
        return self.where.url


def _expected(where: Location) -> Expected | None:
    """The part's sidecar, or None for a bare file (checked sample by sample instead)."""
    url = where.url
    try:
        sidecar = read_sidecar(where)
    except FileNotFoundError:
        return None
    except ValueError as e:  # torn or foreign: the per-sample check still covers the part
        log.warning("%s; checking %s sample by sample instead", e, url)
        return None
    return Expected(
        url=url, sidecar_url=sidecar_url(url), sha256=sidecar["sha256"], size=sidecar["bytes"]
    )


def survey(
    locations: Sequence[Location], files: FileChecks
) -> tuple[list[Part], np.ndarray, list[tuple[str, str]]]:
    """Read every part's header and index; refuse a mix; count samples per (split, class).

    The hash of every local part that has a sidecar starts here, before its survey.
    """
    parts: list[Part] = []
    counts = np.zeros(0, np.int64)
    bad: list[tuple[str, str]] = []
    for i, where in enumerate(locations):
        url = where.url
        fmt.refuse_partial(url)
        expected, identity = _expected(where), None
        if where.is_local and os.path.exists(where.path):
            identity = FileIdentity.of(where.path)
            if expected is not None:
                files.start(i, where.path, expected)
        with open_h5(where) as h5:
            idx = load_index(h5, where=url)
            check_labels(idx, where=url)  # the counts below are indexed by label and split
            images = h5[fmt.IMAGES]
            plist = images.id.get_create_plist()
            part = Part(
                where=where,
                n=idx.header.num_samples,
                attrs={k: _text(h5.attrs.get(k, "")) for k in _SAME},
                classes=idx.classes,
                split_names=idx.split_names,
                image_shape=tuple(int(x) for x in images.shape[1:])
                if idx.header.storage == "array"
                else (int(images.shape[0]),),
                filters=tuple(plist.get_filter(k)[0] for k in range(plist.get_nfilters())),
                expected=expected,
                identity=identity,
            )
            if parts:
                _same(parts[0], part)
            else:
                counts = np.zeros(len(part.split_names) * len(part.classes), np.int64)
            k = len(part.classes)
            codes = idx.split_codes.astype(np.int64) * k + idx.labels
            counts += np.bincount(codes, minlength=len(counts))[: len(counts)]
            if idx.header.num_quarantined:
                bad.extend(
                    zip(
                        h5[fmt.QUARANTINE_PATHS].asstr()[()].tolist(),
                        h5[fmt.QUARANTINE_REASONS].asstr()[()].tolist(),
                        strict=True,
                    )
                )
        parts.append(part)
    return parts, counts.reshape(len(parts[0].split_names), len(parts[0].classes)), bad


def _same(first: Part, other: Part) -> None:
    pairs: list[tuple[str, object, object]] = [
        (f"root attribute {k}", first.attrs[k], other.attrs[k]) for k in _SAME
    ]
    pairs += [
        ("/classes", first.classes, other.classes),
        ("/split_names", first.split_names, other.split_names),
        ("/images filters", first.filters, other.filters),
    ]
    if first.attrs[fmt.A_STORAGE] == "array":
        pairs.append(("image shape (H, W, C)", first.image_shape, other.image_shape))
    for what, a, b in pairs:
        if a != b:
            raise ValueError(
                f"parts disagree on {what}: {first.url} has {a!r}, {other.url} has {b!r}; "
                "every part of one build must come from the same catalog and options — "
                "re-pack the odd ones"
            )
