"""The metadata digest: one sha256 over everything in an asset but the image bytes.

The writer stores it as the root attribute ``metadata_sha256`` before sealing and ``verify``
recomputes it, so no attribute, label, path, class name or quarantine entry can change
unnoticed; the image bytes are covered by ``/digests``, which this digest covers in turn. The
target values (``/targets/NAME/values``, format version 2) are left out the same way: each
column's ``digests`` covers them, and this digest covers those.
"""

from __future__ import annotations

import hashlib
import json

import h5py
import numpy as np

from h5forge.asset import format as fmt

__all__ = ["metadata_sha256"]

# Root attributes the metadata digest leaves out: itself, and ``sealed`` (written after it).
_UNHASHED_ATTRS = frozenset({fmt.A_METADATA_SHA256, fmt.A_SEALED})


def _canonical(value: object) -> object:
    """A JSON-able, type-preserving form of an attribute value as h5py returns it."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, h5py.Reference):  # never written by h5forge; hashed, never followed
        return {"reference": repr(value)}
    if isinstance(value, np.ndarray):
        return {
            "array": value.dtype.str,
            "shape": list(value.shape),
            "items": [_canonical(v) for v in value.ravel().tolist()],
        }
    if isinstance(value, np.generic):
        return {value.dtype.str: _canonical(value.item())}
    if isinstance(value, float):
        return {"float": value.hex()}
    return value


def _bulk(name: str) -> bool:
    """The datasets of sample bytes, covered by per-sample digests instead."""
    parts = name.split("/")
    return name == fmt.IMAGES or (
        len(parts) == 3 and parts[0] == fmt.TARGETS and parts[2] == "values"
    )


def metadata_sha256(h5: h5py.File) -> str:
    """sha256 hex over everything in an open file but the image bytes and two attributes.

    Covers every root attribute (name, stored type, value) except ``metadata_sha256`` and
    ``sealed``, and every dataset except ``/images`` and ``/targets/*/values`` (name, stored
    type, shape, attributes and contents; strings as their stored UTF-8 bytes). The image
    bytes are covered by ``/digests`` (the target values by their column's ``digests``),
    which this digest covers in turn. The writer stores the result as the root
    attribute ``metadata_sha256`` before sealing; ``verify`` recomputes it, so a changed
    creation time, class name, path, quarantine entry or any attribute cannot pass.

    Raises:
        UnicodeDecodeError, OSError, KeyError: from h5py when the file is damaged.
    """
    digest = hashlib.sha256(b"h5forge-metadata-v1\n")

    def put(record: object) -> None:
        text = json.dumps(record, sort_keys=True, ensure_ascii=True).encode()
        digest.update(len(text).to_bytes(8, "little") + text)

    def attrs(obj: h5py.HLObject, skip: frozenset[str]) -> None:
        # A damaged name may not decode: h5py then gives bytes, sorted by their UTF-8 form.
        for name in sorted(
            obj.attrs,
            key=lambda k: k if isinstance(k, bytes) else k.encode("utf-8", "surrogateescape"),
        ):
            if name not in skip:
                stored = obj.attrs.get_id(name).dtype.str
                put(["attr", _canonical(name), stored, _canonical(obj.attrs[name])])

    attrs(h5, _UNHASHED_ATTRS)
    names: list[str] = []
    h5.visititems(
        lambda name, obj: (
            names.append(name) if isinstance(obj, h5py.Dataset) and not _bulk(name) else None
        )
    )
    for name in sorted(names):
        ds = h5[name]
        put(["dataset", name, ds.dtype.str, list(ds.shape)])
        attrs(ds, frozenset())
        data = ds[()]
        if h5py.check_string_dtype(ds.dtype) is not None:
            for item in np.asarray(data, dtype=object).ravel().tolist():
                raw = item if isinstance(item, bytes) else str(item).encode("utf-8")
                digest.update(len(raw).to_bytes(8, "little") + raw)
        else:
            digest.update(np.ascontiguousarray(data).tobytes())
    return digest.hexdigest()
