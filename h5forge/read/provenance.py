"""Where an asset's samples came from: each sample's source path, and the asset's provenance.

:class:`H5ImageDataset <h5forge.read.dataset.H5ImageDataset>` offers them as
:meth:`SampleSources.source_path`, :attr:`SampleSources.sources` and
:attr:`SampleSources.provenance`, from the file's ``/paths`` dataset and its root attributes
(docs/FORMAT.md). They are read on first use, in the process that asks, with one opening of the
file, and kept there; they are never pickled, so DataLoader workers that never ask never read
them. The file is untrusted input: attribute values are returned as text, and the two JSON
attributes are parsed only when they are at most :data:`MAX_JSON_BYTES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.open import open_h5
from h5forge.documents import DocumentError, parse_json
from h5forge.location import Location

__all__ = ["MAX_JSON_BYTES", "PROVENANCE_ATTRS", "SampleSources", "read_provenance"]

#: The root attributes that say how and from what an asset was made (docs/FORMAT.md).
PROVENANCE_ATTRS = (
    fmt.A_SOURCE_URL,
    fmt.A_SOURCE_SHA256,
    fmt.A_SOURCE_FINGERPRINT,
    fmt.A_CREATED_AT,
    fmt.A_H5FORGE_VERSION,
    fmt.A_CONFIG_SHA256,
    fmt.A_PARENT_SHA256,
    fmt.A_FLOW_RUN_ID,
)
#: Largest JSON attribute parsed (``config_json`` is a few hundred bytes).
MAX_JSON_BYTES = 1 << 20
_JSON_ATTRS = {fmt.A_CONFIG_JSON: "config", fmt.A_CHANGES_JSON: "changes"}


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        value = value.item()
    return value if isinstance(value, str) else repr(value)


def read_provenance(h5: Any) -> dict[str, Any]:
    """The provenance attributes of an open file: text each (``""`` when absent), and
    ``config`` and ``changes`` parsed from their JSON (None when absent or not JSON)."""
    found: dict[str, Any] = {k: _text(h5.attrs.get(k, "")) for k in PROVENANCE_ATTRS}
    for attr, key in _JSON_ATTRS.items():
        text = _text(h5.attrs.get(attr, ""))
        parsed = None
        if text and len(text) <= MAX_JSON_BYTES:
            try:
                parsed = parse_json(text, what=f"{attr} attribute", name=attr)
            except DocumentError:
                parsed = None  # shown as absent; `h5forge verify` reports a damaged file
        found[key] = parsed
    return found


class SampleSources:
    """Source paths and provenance of an open asset (mixed into ``H5ImageDataset``)."""

    url: str
    version: str
    storage_options: dict[str, Any]

    def _rows(self, indices: Sequence[int]) -> list[int]:
        raise NotImplementedError  # the dataset's: file rows of dataset indices

    def _load_sources(self) -> tuple[np.ndarray, dict[str, Any]]:
        loaded = self.__dict__.get("_sources_loaded")
        if loaded is None:
            with open_h5(Location(self.url, self.storage_options)) as h5:
                paths = np.asarray(h5[fmt.PATHS].asstr()[()], dtype=object).reshape(-1)
                loaded = (paths, read_provenance(h5))
            self.__dict__["_sources_loaded"] = loaded
        return loaded

    def source_path(self, i: int) -> str:
        """The source path of sample ``i`` (this dataset's index, after ``split``), relative
        to the source's root with ``/`` separators, as packed: e.g. ``train/cat/001.jpg``.

        Raises:
            IndexError: ``i`` is out of range.
        """
        [row] = self._rows([i])
        return str(self._load_sources()[0][row])

    @property
    def sources(self) -> list[str]:
        """The source path of every sample of this dataset, in index order."""
        paths = self._load_sources()[0]
        return [str(p) for p in paths[self._rows(range(len(self)))]]

    @property
    def provenance(self) -> dict[str, Any]:
        """How and from what the asset was made, as its file records it.

        Keys: ``url`` (the file read) and ``sha256`` (the version's, ``""`` when opened by a
        file name); ``source_url`` (credentials redacted), ``source_sha256`` (of a source
        archive), ``source_fingerprint``, ``created_at`` (UTC, ISO 8601), ``h5forge_version``,
        ``config_sha256``, ``parent_sha256`` (the version it replaced), ``flow_run_id`` (the
        Prefect run that built it), each ``""`` when unknown; ``config`` (the preprocessing
        and storage configuration) and ``changes`` (source files added, removed, replaced
        since the parent), parsed, or None.
        """
        return {"url": self.url, "sha256": self.version, **self._load_sources()[1]}

    def __len__(self) -> int:
        raise NotImplementedError  # the dataset's
