"""The h5forge file format, versions 1 and 2: the one module that knows names and layout.

``docs/FORMAT.md`` is the normative description; this module mirrors it and a test checks that
every dataset and attribute the writer produces is listed in both places.

A file holds one of three storages for its images:

* ``array``: decoded pixels, fixed size, ``/images`` is ``(N, H, W, C) uint8`` with one sample per
  chunk;
* ``blob``: ``/images`` is one contiguous ``(B,) uint8`` dataset; sample ``i`` is
  ``images[offsets[i]:offsets[i + 1]]``. Used for encoded images and for decoded images of
  varying size (``/shapes`` gives each sample's ``(H, W, C)``).

In both, ``/byte_ranges[i] = (file_offset, nbytes)`` says where sample ``i``'s stored bytes lie in
the file, so a reader can fetch a sample with one ``pread`` or one HTTP range request without
walking HDF5 metadata.

Version 2 is version 1 plus target columns (:mod:`h5forge.targets.store`): the root attribute
``targets_json`` (the schema) and ``/targets/NAME/{values,offsets,shapes,digests}``. A file
without targets is version 1, byte for byte; readers accept both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

__all__ = [
    "ATTR_DESCRIPTIONS",
    "DATASET_DESCRIPTIONS",
    "DIGEST_ALGORITHM",
    "DIGEST_SIZE",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "TARGETS_VERSION",
    "PARTIAL_SUFFIX",
    "OPTIONAL_ATTRS",
    "Header",
    "Storage",
]

FORMAT_NAME = "h5forge"
FORMAT_VERSION = 1  # a file without target columns
TARGETS_VERSION = 2  # a file with target columns (root attribute targets_json)
FORMAT_VERSIONS = (FORMAT_VERSION, TARGETS_VERSION)  # what readers accept
PARTIAL_SUFFIX = ".partial"
DIGEST_ALGORITHM = "sha256"
DIGEST_SIZE = 32

Storage = Literal["array", "blob"]
LayoutName = Literal["decoded", "encoded"]
EncodingName = Literal["raw", "original", "jpeg", "png", "webp"]
ModeName = Literal["RGB", "L"]

# Dataset and attribute names. Writer, verifier and reader use only these constants.
IMAGES = "images"
OFFSETS = "offsets"
SHAPES = "shapes"
BYTE_RANGES = "byte_ranges"
LABELS = "labels"
CLASSES = "classes"
SPLITS = "splits"
SPLIT_NAMES = "split_names"
PATHS = "paths"
DIGESTS = "digests"
QUARANTINE_PATHS = "quarantine/paths"
QUARANTINE_REASONS = "quarantine/reasons"

A_FORMAT = "format"
A_VERSION = "format_version"
A_H5FORGE_VERSION = "h5forge_version"
A_CREATED_AT = "created_at"
A_LAYOUT = "layout"
A_STORAGE = "storage"
A_ENCODING = "encoding"
A_MODE = "mode"
A_CONFIG_JSON = "config_json"
A_CONFIG_SHA256 = "config_sha256"
A_SOURCE_URL = "source_url"
A_SOURCE_SHA256 = "source_sha256"
A_NUM_SAMPLES = "num_samples"
A_NUM_CLASSES = "num_classes"
A_NUM_QUARANTINED = "num_quarantined"
A_DIGEST_ALGORITHM = "digest_algorithm"
A_COMPRESSION = "compression"
A_METADATA_SHA256 = "metadata_sha256"
A_SEALED = "sealed"
# Lineage: optional, written only when the build knows them (a versioned publish).
A_PARENT_SHA256 = "parent_sha256"
A_SOURCE_FINGERPRINT = "source_fingerprint"
A_FLOW_RUN_ID = "flow_run_id"
A_CHANGES_JSON = "changes_json"
# Version 2 only: the target schema (h5forge.targets.schema.schema_json).
A_TARGETS_JSON = "targets_json"
A_SHARD = "shard"  # optional: 1 in a shard of a sharded version (FORMAT.md, minor version 1)
TARGETS = "targets"  # the group of the target columns, /targets/NAME/...
#: The datasets of one target column, by kind (under /targets/NAME/).
TARGET_DATASETS: dict[str, tuple[str, ...]] = {
    "multilabel": ("values", "offsets", "digests"),
    "boxes": ("values", "offsets", "digests"),
    "mask": ("values", "offsets", "shapes", "digests"),
    "text": ("values", "offsets", "digests"),
    "number": ("values", "digests"),
}

#: Every dataset the writer may create, with its normative description (FORMAT.md mirrors it).
DATASET_DESCRIPTIONS: dict[str, str] = {
    IMAGES: "array storage: (N, H, W, C) uint8, chunks (1, H, W, C); "
    "blob storage: (B,) uint8, contiguous",
    OFFSETS: "blob storage only: (N + 1,) uint64, sample i is images[offsets[i]:offsets[i+1]]",
    SHAPES: "blob storage only: (N, 3) uint32, decoded (H, W, C) of each sample",
    BYTE_RANGES: "(N, 2) uint64, absolute (file offset, byte count) of each sample's stored bytes",
    LABELS: "(N,) int64, class index 0..K-1",
    CLASSES: "(K,) UTF-8 string, class names sorted; label i is classes[i]",
    SPLITS: "(N,) uint8, index into split_names",
    SPLIT_NAMES: "(S,) UTF-8 string, split names; [''] when the source has no splits",
    PATHS: "(N,) UTF-8 string, source path of each sample relative to the dataset root",
    DIGESTS: "(N, 32) uint8, sha256 of each sample's stored bytes (uncompressed)",
    QUARANTINE_PATHS: "(Q,) UTF-8 string, source paths that were not packed",
    QUARANTINE_REASONS: "(Q,) UTF-8 string, why each quarantined path was not packed",
    "targets/NAME/values": "version 2: one column's stored rows back to back, contiguous, "
    "unfiltered: (M,) int32 (multilabel), (M, 6) float32 (boxes), (B,) uint8 (mask, text), "
    "(N,) int64 or float64 (number)",
    "targets/NAME/offsets": "version 2, all but number: (N + 1,) uint64, sample i is "
    "values[offsets[i]:offsets[i+1]] (rows), from 0 to len(values)",
    "targets/NAME/shapes": "version 2, mask only: (N, 2) uint32, (H, W) of each mask",
    "targets/NAME/digests": "version 2: (N, 32) uint8, sha256 of each sample's stored bytes "
    "in this column",
}

#: Every root attribute the writer writes, with its normative description.
ATTR_DESCRIPTIONS: dict[str, str] = {
    A_FORMAT: "string, always 'h5forge'",
    A_VERSION: "int, format version: 1, or 2 exactly when the file has target columns",
    A_H5FORGE_VERSION: "string, version of h5forge that wrote the file",
    A_CREATED_AT: "string, UTC creation time, ISO 8601",
    A_LAYOUT: "string, 'decoded' (raw pixels) or 'encoded' (image file bytes)",
    A_STORAGE: "string, 'array' or 'blob'",
    A_ENCODING: "string, 'raw' for decoded; 'original', 'jpeg', 'png' or 'webp' for encoded",
    A_MODE: "string, 'RGB' (C=3) or 'L' (C=1)",
    A_CONFIG_JSON: "string, the preprocessing configuration as canonical JSON",
    A_CONFIG_SHA256: "string, sha256 hex digest of config_json",
    A_SOURCE_URL: "string, where the source came from (credentials redacted); '' if unknown",
    A_SOURCE_SHA256: "string, sha256 hex of the source archive; '' if unknown",
    A_NUM_SAMPLES: "int, N",
    A_NUM_CLASSES: "int, K",
    A_NUM_QUARANTINED: "int, Q",
    A_DIGEST_ALGORITHM: "string, always 'sha256'",
    A_COMPRESSION: "string, HDF5 filter on /images: 'none', 'gzip-<level>', 'lzf', ...",
    A_METADATA_SHA256: "string, sha256 hex of every root attribute but itself and sealed, and "
    "every dataset but /images (canonical serialisation, see metadata_sha256())",
    A_SEALED: "bool, written last, after verification; a file without it is not valid",
    A_PARENT_SHA256: "string, optional: sha256 hex of the version this file replaced as latest",
    A_SOURCE_FINGERPRINT: "string, optional: sha256 hex of the source's pre-fetch fingerprint",
    A_FLOW_RUN_ID: "string, optional: the Prefect flow run that built the file",
    A_CHANGES_JSON: "string, optional: JSON {added, removed, replaced} source files vs the parent",
    A_SHARD: "int, optional: 1 in a shard of a sharded version (minor version 1): its "
    "created_at, h5forge_version, source_url and source_sha256 are '' (the version manifest "
    "records them), so that its bytes depend only on its samples and configuration",
    A_TARGETS_JSON: "string, version 2 only: the target columns as canonical JSON (name, kind, "
    "classes, dtype, mask encoding 'raw' or 'png')",
}

#: The optional root attributes (lineage): absent from a file built without them.
OPTIONAL_ATTRS: frozenset[str] = frozenset(
    (A_PARENT_SHA256, A_SOURCE_FINGERPRINT, A_FLOW_RUN_ID, A_CHANGES_JSON, A_SHARD)
)

_INDEX = (
    LABELS,
    CLASSES,
    SPLITS,
    SPLIT_NAMES,
    PATHS,
    DIGESTS,
    QUARANTINE_PATHS,
    QUARANTINE_REASONS,
)
REQUIRED_DATASETS: dict[Storage, tuple[str, ...]] = {
    "array": (IMAGES, BYTE_RANGES, *_INDEX),
    "blob": (IMAGES, OFFSETS, SHAPES, BYTE_RANGES, *_INDEX),
}


@dataclass(frozen=True)
class Header:
    """The root attributes a reader needs before touching any sample."""

    format_version: int
    layout: LayoutName
    storage: Storage
    encoding: EncodingName
    mode: ModeName
    num_samples: int
    num_classes: int
    num_quarantined: int
    compression: str
    sealed: bool
    targets_json: str = ""  # version 2: the schema (h5forge.targets.schema.parse_schema)

    @property
    def channels(self) -> int:
        """Number of channels of a decoded sample (3 for RGB, 1 for L)."""
        return 1 if self.mode == "L" else 3


def _as_str(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_header(attrs: object, *, where: str) -> Header:
    """Parse and check the root attributes (an ``h5py.AttributeManager``).

    Raises:
        UnsealedFileError: not an h5forge file, an unknown version, or not sealed (the message
            says which).
    """
    from h5forge.errors import UnsealedFileError

    a = attrs  # h5py AttributeManager; typed loosely to keep h5py out of this module's API
    get = a.get  # type: ignore[attr-defined]
    name = get(A_FORMAT)
    if name is None or _as_str(name) != FORMAT_NAME:
        raise UnsealedFileError(
            f"{where} is not an h5forge file: root attribute {A_FORMAT!r} is {name!r}, "
            f"expected {FORMAT_NAME!r}; pack it with `h5forge pack`"
        )
    version = int(get(A_VERSION, -1))
    if version not in FORMAT_VERSIONS:
        raise UnsealedFileError(
            f"{where} has format version {version}, this h5forge reads versions "
            f"{FORMAT_VERSIONS}; upgrade h5forge or re-pack the file"
        )
    targets = get(A_TARGETS_JSON)
    if (targets is not None) != (version == TARGETS_VERSION):
        raise UnsealedFileError(
            f"{where} has format version {version} "
            f"{'without' if targets is None else 'with'} the root attribute {A_TARGETS_JSON!r}: "
            f"version {TARGETS_VERSION} exactly when it has target columns; the file is damaged "
            "or not written by h5forge"
        )
    sealed = bool(get(A_SEALED, False))
    storage = _as_str(get(A_STORAGE, ""))
    if storage not in ("array", "blob"):
        raise UnsealedFileError(
            f"{where}: root attribute storage={storage!r}, expected 'array' or 'blob'"
        )
    layout, encoding, mode = (
        _as_str(get(A_LAYOUT, "")),
        _as_str(get(A_ENCODING, "")),
        _as_str(get(A_MODE, "")),
    )
    for attr, value, allowed in (
        (A_LAYOUT, layout, get_args(LayoutName)),
        (A_ENCODING, encoding, get_args(EncodingName)),
        (A_MODE, mode, get_args(ModeName)),
    ):
        if value not in allowed:
            raise UnsealedFileError(
                f"{where}: root attribute {attr}={value!r}, expected one of "
                f"{allowed}; the file is damaged or not written by h5forge"
            )
    return Header(
        format_version=version,
        layout=cast(LayoutName, layout),
        storage=cast(Storage, storage),
        encoding=cast(EncodingName, encoding),
        mode=cast(ModeName, mode),
        num_samples=int(get(A_NUM_SAMPLES, -1)),
        num_classes=int(get(A_NUM_CLASSES, -1)),
        num_quarantined=int(get(A_NUM_QUARANTINED, 0)),
        compression=_as_str(get(A_COMPRESSION, "none")),
        sealed=sealed,
        targets_json="" if targets is None else _as_str(targets),
    )


def require_sealed(header: Header, *, where: str) -> None:
    """Raise ``UnsealedFileError`` unless the header carries the ``sealed`` attribute."""
    from h5forge.errors import UnsealedFileError

    if not header.sealed:
        raise UnsealedFileError(
            f"{where} is not sealed: the writer did not finish (interrupted, or verification "
            "failed), so its contents are not trustworthy; re-run the pack"
        )


def refuse_partial(url: str) -> None:
    """Raise ``UnsealedFileError`` for a ``*.partial`` path."""
    from h5forge.errors import UnsealedFileError

    if url.endswith(PARTIAL_SUFFIX):
        raise UnsealedFileError(
            f"{url} is a {PARTIAL_SUFFIX} file: a pack in progress or one that was interrupted; "
            "open the finished file (without the suffix) or re-run the pack"
        )
