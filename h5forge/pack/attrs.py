"""The root attributes of a new file, as FORMAT.md lists them (all but ``sealed``)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from h5forge.asset import format as fmt
from h5forge.documents import parse_json
from h5forge.targets.schema import Column, schema_json

if TYPE_CHECKING:
    from h5forge.pack.config import PackConfig

__all__ = ["check_lineage", "pack_attrs", "root_attrs"]


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
    lineage: Mapping[str, str] | None = None,
    targets_json: str = "",
    shard: bool = False,
) -> dict[str, Any]:
    """Every root attribute but ``sealed`` (and ``metadata_sha256``, set when sealing).

    Args:
        config_json, compression: of the file's :class:`~h5forge.pack.config.PackConfig`
            (:meth:`~PackConfig.to_json`, :attr:`~PackConfig.compression_attr`); a merge
            gives its parts' own. ``config_sha256`` is the sha256 of ``config_json``
            (:meth:`~PackConfig.sha256`).
        num_samples, num_quarantined: placeholders while packing (fixed up in place at the end).
        lineage: the optional lineage attributes (see :func:`check_lineage`); none by default.
        targets_json: the target schema (:func:`h5forge.targets.schema.schema_json`); when
            set, the file is format version 2 and records it, else version 1 without it.
        shard: a shard of a sharded version: what varies between runs (``created_at``,
            ``h5forge_version``, the source's URL and sha256) is left empty, and ``shard`` is 1,
            so that the same samples and configuration give the same bytes (FORMAT.md).
    """
    from h5forge import __version__

    if shard:
        source_url = source_sha256 = ""
    return {
        fmt.A_FORMAT: fmt.FORMAT_NAME,
        fmt.A_VERSION: fmt.TARGETS_VERSION if targets_json else fmt.FORMAT_VERSION,
        fmt.A_H5FORGE_VERSION: "" if shard else __version__,
        fmt.A_CREATED_AT: "" if shard else datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
        **check_lineage(lineage),
        **({fmt.A_TARGETS_JSON: targets_json} if targets_json else {}),
        **({fmt.A_SHARD: 1} if shard else {}),
    }


def pack_attrs(
    config: PackConfig,
    *,
    num_samples: int,
    num_classes: int,
    schema: Sequence[Column],
    source_url: str = "",
    source_sha256: str = "",
    lineage: Mapping[str, str] | None = None,
    shard: bool = False,
) -> dict[str, Any]:
    """:func:`root_attrs` of a pack with ``config``, target columns ``schema`` (stored form,
    see :func:`h5forge.pack.targets.stored_schema`; ``()``: a version 1 file)."""
    return root_attrs(
        layout=config.image.layout,
        storage="array" if config.fixed_size else "blob",
        encoding="raw" if config.image.layout == "decoded" else config.image.encoding,
        mode=config.image.mode,
        config_json=config.to_json(),
        compression=config.compression_attr,
        source_url=source_url,
        source_sha256=source_sha256,
        num_samples=num_samples,
        num_classes=num_classes,
        num_quarantined=0,
        lineage=lineage,
        targets_json=schema_json(schema) if schema else "",
        shard=shard,
    )


def check_lineage(lineage: Mapping[str, str] | None) -> dict[str, str]:
    """The lineage root attributes, checked: ``parent_sha256`` and ``source_fingerprint`` are
    sha256 hex (or ``""``), ``flow_run_id`` a string, ``changes_json`` a JSON object of counts.

    Raises:
        ValueError: a key that is not a lineage attribute, or a value of the wrong form.
    """
    found = dict(lineage or {})
    unknown = sorted(set(found) - fmt.OPTIONAL_ATTRS)
    if unknown:
        raise ValueError(f"lineage keys {unknown} unknown: allowed {sorted(fmt.OPTIONAL_ATTRS)}")
    for key, value in found.items():
        if not isinstance(value, str) or len(value) > 4096:
            raise ValueError(f"lineage {key}={value!r:.80} must be a string of at most 4096 chars")
    for key in (fmt.A_PARENT_SHA256, fmt.A_SOURCE_FINGERPRINT):
        value = found.get(key, "")
        if value and (len(value) != 64 or value.strip("0123456789abcdef")):
            raise ValueError(f"lineage {key}={value!r} must be 64 lower-case hex digits or ''")
    if fmt.A_CHANGES_JSON in found:
        changes = parse_json(
            found[fmt.A_CHANGES_JSON], what="lineage attribute", name=fmt.A_CHANGES_JSON
        )
        if not isinstance(changes, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in changes.values()
        ):
            raise ValueError(
                f"lineage changes_json {found[fmt.A_CHANGES_JSON]!r} must be a JSON "
                'object of counts, such as {"added": 1, "removed": 0}'
            )
    return found
