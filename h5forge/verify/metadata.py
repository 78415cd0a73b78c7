"""Verify what an asset's index and attributes claim: labels, split codes, unique sample paths
and two digests.

The declared shapes, types and counts are checked before this runs (by
:func:`h5forge.asset.index.load_index`, through :func:`h5forge.asset.declared.check_declared`);
here every label and split code is checked against the names, ``config_sha256`` against
``config_json``, and ``metadata_sha256`` against the root attributes and index datasets
(:func:`h5forge.asset.metadata.metadata_sha256`). Every failure is listed, not only the first.
"""

from __future__ import annotations

import hashlib

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import AssetIndex, repeated_paths
from h5forge.asset.metadata import metadata_sha256

__all__ = ["check_metadata"]


def check_metadata(h5: h5py.File, idx: AssetIndex, fails: list[str]) -> None:
    """Append to ``fails`` each label or split code out of range (the first 100 of each) and
    each attribute digest that does not match what it covers."""
    hdr = idx.header
    for i in np.flatnonzero((idx.labels < 0) | (idx.labels >= hdr.num_classes))[:100]:
        fails.append(
            f"label {idx.labels[i]} out of range: file declares {hdr.num_classes} "
            f"classes (0..{hdr.num_classes - 1}) in /labels[{i}]"
        )
    for i in np.flatnonzero(idx.split_codes >= len(idx.split_names))[:100]:
        fails.append(
            f"split code {idx.split_codes[i]} out of range 0..{len(idx.split_names) - 1}"
            f" in /splits[{i}]"
        )
    if hdr.num_samples:
        fails.extend(repeated_paths(h5[fmt.PATHS].asstr()[: hdr.num_samples].tolist()))
    config = h5.attrs.get(fmt.A_CONFIG_JSON, "")
    config = config.decode() if isinstance(config, bytes) else str(config)
    want_hash = hashlib.sha256(config.encode("utf-8", "surrogateescape")).hexdigest()
    got_hash = str(h5.attrs.get(fmt.A_CONFIG_SHA256, ""))
    if got_hash != want_hash:
        fails.append(f"config_sha256 attribute is {got_hash}, sha256(config_json) is {want_hash}")
    got_meta = h5.attrs.get(fmt.A_METADATA_SHA256)
    want_meta = metadata_sha256(h5)
    if got_meta is None:
        fails.append(
            f"root attribute {fmt.A_METADATA_SHA256} is missing: the attributes, labels,"
            " paths and class names cannot be checked; re-pack the file"
        )
    elif str(got_meta) != want_meta:
        fails.append(
            f"{fmt.A_METADATA_SHA256} attribute is {got_meta}, the root attributes and "
            f"index datasets hash to {want_meta}: an attribute, label, offset, path, "
            "class name or quarantine entry changed"
        )
