"""The root attributes of a new file, as FORMAT.md lists them (all but ``sealed``)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from h5forge.asset import format as fmt

__all__ = ["root_attrs"]


def root_attrs(
    *,
    layout: str,
    storage: str,
    encoding: str,
    mode: str,
    config_json: str,
    compression: str,
    source_url: str,
    source_sha256: str,
    num_samples: int,
    num_classes: int,
    num_quarantined: int,
) -> dict[str, Any]:
    """Every root attribute but ``sealed`` (and ``metadata_sha256``, set when sealing).

    Args:
        config_json, compression: of the file's :class:`~h5forge.pack.config.PackConfig`
            (:meth:`~PackConfig.to_json`, :attr:`~PackConfig.compression_attr`); a merge
            gives its shards' own. ``config_sha256`` is the sha256 of ``config_json``
            (:meth:`~PackConfig.sha256`).
        num_samples, num_quarantined: placeholders while packing (fixed up in place at the end).
    """
    from h5forge import __version__

    return {
        fmt.A_FORMAT: fmt.FORMAT_NAME,
        fmt.A_VERSION: fmt.FORMAT_VERSION,
        fmt.A_H5FORGE_VERSION: __version__,
        fmt.A_CREATED_AT: datetime.now(timezone.utc).isoformat(timespec="seconds"),
        fmt.A_LAYOUT: layout,
        fmt.A_STORAGE: storage,
        fmt.A_ENCODING: encoding,
        fmt.A_MODE: mode,
        fmt.A_CONFIG_JSON: config_json,
        fmt.A_CONFIG_SHA256: hashlib.sha256(config_json.encode()).hexdigest(),
        fmt.A_SOURCE_URL: source_url,
        fmt.A_SOURCE_SHA256: source_sha256,
        fmt.A_NUM_SAMPLES: num_samples,
        fmt.A_NUM_CLASSES: num_classes,
        fmt.A_NUM_QUARANTINED: num_quarantined,
        fmt.A_DIGEST_ALGORITHM: fmt.DIGEST_ALGORITHM,
        fmt.A_COMPRESSION: compression,
    }
