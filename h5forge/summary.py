"""A JSON-ready summary of an h5forge file: attributes, counts per split and class, quarantine."""

from __future__ import annotations

from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import check_index, check_labels, load_index
from h5forge.asset.open import open_h5
from h5forge.asset.target_layout import file_schema
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS

__all__ = ["summarize", "summarize_sharded"]


def _plain(value: Any) -> Any:
    """A JSON-able form of an attribute value (a foreign file may hold any type)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.ravel().tolist()[:64]]
    if isinstance(value, np.generic):
        return _plain(value.item())
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)  # e.g. an object reference: shown, never followed


def summarize(where: Location, *, max_quarantined: int = 50) -> dict[str, Any]:
    """Summarise the file at ``where`` (sealed or not — the summary says which).

    Returns:
        ``attributes`` (root attributes), ``bytes``, ``counts`` (split -> class -> n),
        ``quarantined`` (first ``max_quarantined`` (path, reason) pairs), ``image_shape``,
        ``targets`` (the target columns, as ``targets_json`` records them; ``[]``: version 1).

    Raises:
        IntegrityError: the file refers outside itself, declares sizes it cannot hold, or has
            a label or split code out of range (the counts could not be made); see
            docs/FORMAT.md, "What readers refuse".
        MissingExtraError: the file is compressed with a codec that needs ``hdf5plugin``.
    """
    url = where.url
    with open_h5(where) as h5:
        idx = load_index(h5, where=url, require_sealed=False)
        if idx.header.sealed:  # what a reader refuses, inspect refuses too
            check_index(idx, h5.id.get_filesize(), where=url, max_pixels=DEFAULT_MAX_PIXELS)
        else:  # an unfinished file's byte ranges are not written yet; its labels may be
            check_labels(idx, where=url)  # the counts below are indexed by label and split
        attrs = {k: _plain(v) for k, v in sorted(h5.attrs.items()) if k != fmt.A_CONFIG_JSON}
        counts: dict[str, dict[str, int]] = {}
        for code, split in enumerate(idx.split_names):
            labels = idx.labels[idx.split_codes == code]
            per: Any = np.bincount(labels, minlength=len(idx.classes)) if len(labels) else []
            counts[split] = {c: int(n) for c, n in zip(idx.classes, per, strict=False) if n}
        q_paths = h5[fmt.QUARANTINE_PATHS].asstr()[:max_quarantined].tolist()
        q_reasons = h5[fmt.QUARANTINE_REASONS].asstr()[:max_quarantined].tolist()
        images = h5[fmt.IMAGES]
        schema = file_schema(idx.header, where=url)
        return {
            "url": url,
            "bytes": int(where.fs.size(where.path)),
            "sealed": idx.header.sealed,
            "attributes": attrs,
            "config": _plain(h5.attrs.get(fmt.A_CONFIG_JSON, "")),
            "image_shape": list(idx.image_shape) if idx.image_shape else "variable",
            "images_dataset": {
                "shape": list(images.shape),
                "chunks": images.chunks,
                "compression": images.compression,
            },
            "counts": counts,
            "targets": [c.to_dict() for c in schema],
            "quarantined": [list(p) for p in zip(q_paths, q_reasons, strict=True)],
        }


def summarize_sharded(where: Location, sha256: str) -> dict[str, Any]:
    """:func:`summarize`'s summary of the sharded version whose manifest is at ``where`` (its
    sha256 ``sha256``): the manifest's facts, the first shard's layout attributes, and counts
    per split and class read from every shard's labels (each shard checked against its entry
    as a reader checks it); ``shards`` and ``first_shard`` (its URL) besides.

    Raises:
        IntegrityError: the manifest or a shard is not what the version names.
    """
    from h5forge.read.options import ReadOptions
    from h5forge.read.sharded import ShardedVersion

    version = ShardedVersion(where, sha256, ReadOptions())
    m = version.manifest
    totals: dict[str, Any] = {split: np.zeros(len(m.classes), np.int64) for split in m.split_names}
    for k in range(len(m.shards)):  # each shard opened and checked once
        if not version.counts[k]:
            continue
        shard = version.shard(k)
        idx = shard.state.index
        labels = shard.lut[idx.labels[shard.rows]]
        codes = idx.split_codes[shard.rows]
        for code, split in enumerate(idx.split_names):
            per = np.bincount(labels[codes == code], minlength=len(m.classes))
            totals[split] = totals.get(split, 0) + per  # "": no split (not in the manifest)
    counts = {
        split: {c: int(n) for c, n in zip(m.classes, per.tolist(), strict=True) if n}
        for split, per in totals.items()
    }
    attrs: dict[str, Any] = {}
    shape: Any = "variable"
    if m.shards:
        state = version.shard(0).state
        with open_h5(where.with_url(version.shard_url(0))) as h5:
            attrs = {k: _plain(v) for k, v in sorted(h5.attrs.items()) if k != fmt.A_CONFIG_JSON}
        shape = list(state.index.image_shape) if state.index.image_shape else "variable"
    attrs.update(
        {
            fmt.A_CREATED_AT: m.created_at,
            fmt.A_H5FORGE_VERSION: m.h5forge_version,
            fmt.A_SOURCE_URL: m.source_url,
            fmt.A_SOURCE_SHA256: m.source_sha256,
            fmt.A_NUM_SAMPLES: m.num_samples,
            fmt.A_NUM_CLASSES: len(m.classes),
        }
    )
    attrs.pop(fmt.A_NUM_QUARANTINED, None)  # the shards' own, not the version's
    schema = version.schema()
    version.close()
    return {
        "url": where.url,
        "bytes": sum(e.bytes for e in m.shards),
        "sealed": True,
        "shards": len(m.shards),
        "first_shard": version.shard_url(0) if m.shards else "",
        "attributes": attrs,
        "config": m.config_json,
        "image_shape": shape,
        "counts": counts,
        "targets": [c.to_dict() for c in schema],
        "quarantined": [],
    }
