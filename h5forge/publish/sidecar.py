"""The sidecar of a published asset: its URL, how it is written, read and checked.

``NAME.h5.manifest.json`` records the file's sha256, size, counts, format version, creation
time and redacted source. It is written last, after the file was verified at the destination,
so it is the asset's commit marker: a consumer that finds one can trust the file next to it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from h5forge.errors import IntegrityError
from h5forge.location import MAX_SIDECAR_BYTES, SIDECAR_SUFFIX, Location
from h5forge.redact import REDACTED, is_sensitive_key, redact_storage_options, redact_url

if TYPE_CHECKING:
    from h5forge.verify.checks import VerifyReport

__all__ = [
    "check_verified",
    "COMPUTED_FIELDS",
    "FORMAT_NAME",
    "SIDECAR_SUFFIX",
    "check_sidecar",
    "load_sidecar",
    "read_sidecar",
    "sidecar_bytes",
    "sidecar_url",
]

FORMAT_NAME = "h5forge"
# Used when ``extra`` carries no "format_version"; the writer passes the file's real version.
_DEFAULT_FORMAT_VERSION = 1
# Fields publish computes itself; a caller's ``extra`` may not set them.
COMPUTED_FIELDS = frozenset({"format", "sha256", "bytes", "created_at"})
_SHA256 = re.compile(r"[0-9a-f]{64}")


def sidecar_url(url: str) -> str:
    """The sidecar of ``url``: ``url + ".manifest.json"`` (before any query string)."""
    return Location(url).sidecar.url


def read_sidecar(
    url: str | Location, *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Read and check the sidecar of the asset at ``url`` (or of the sidecar URL itself).

    Raises:
        FileNotFoundError: no sidecar, i.e. the asset was never (completely) published.
        ValueError: the sidecar is not valid JSON or lacks format, sha256 or bytes.
    """
    where = Location.of(url, storage_options)
    target = where if where.url.endswith(SIDECAR_SUFFIX) else where.sidecar
    sidecar = load_sidecar(target)
    if sidecar is None:
        raise FileNotFoundError(
            f"no sidecar at {str(target)!r}: the asset is not published (the sidecar "
            "is written last, after the file is verified); publish it again"
        )
    return sidecar


def check_sidecar(
    url: str,
    sidecar: Mapping[str, Any],
    *,
    sha256: str,
    bytes: int,
    num_samples: int,
    num_classes: int,
    format_version: int,
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Compare what the file at ``url`` is with what its sidecar promises.

    The verify command, the re-verify flow and anyone holding a sidecar call this one
    function. ``sha256`` and ``bytes`` must be in the sidecar; ``num_samples``,
    ``num_classes``, ``format_version`` and ``counts`` (split -> class -> n; compared when
    given) must agree when the sidecar records them.

    Raises:
        IntegrityError: one line per disagreement, naming the field, the sidecar's value and
            the file's.
    """
    found: dict[str, Any] = {
        "bytes": bytes,
        "sha256": sha256,
        "num_samples": num_samples,
        "num_classes": num_classes,
        "format_version": format_version,
    }
    if counts is not None:
        found["counts"] = {split: dict(per) for split, per in counts.items()}
    failures = [f"sidecar lacks {k!r}" for k in ("bytes", "sha256") if k not in sidecar]
    for key, actual in found.items():
        if key in sidecar and sidecar[key] != actual:
            failures.append(f"{key}: sidecar says {sidecar[key]!r}, the file has {actual!r}")
    if failures:
        raise IntegrityError(
            f"{redact_url(url)} does not match its sidecar (sha256, size, counts, format version)",
            failures,
        )


def check_verified(
    url: str,
    sidecar: Mapping[str, Any],
    report: VerifyReport,
    *,
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """:func:`check_sidecar` of what :func:`h5forge.verify.checks.verify` found in the file.

    Raises:
        IntegrityError: one line per disagreement (see :func:`check_sidecar`).
    """
    check_sidecar(
        url,
        sidecar,
        sha256=report.sha256,
        bytes=report.bytes,
        num_samples=report.num_samples,
        num_classes=report.num_classes,
        format_version=report.format_version,
        counts=counts,
    )


def load_sidecar(sidecar: Location) -> dict[str, Any] | None:
    """The checked sidecar at ``sidecar`` (the sidecar itself), None when absent.

    Raises:
        ValueError: it is over :data:`h5forge.location.MAX_SIDECAR_BYTES`, not valid JSON, or
            not an h5forge sidecar.
    """
    try:
        # Bounded: a store (or whoever wrote there) may put anything under a sidecar's name.
        data = sidecar.read_json(limit=MAX_SIDECAR_BYTES, what="published sidecar")
    except FileNotFoundError:
        return None
    if not (
        isinstance(data, dict)
        and data.get("format") == FORMAT_NAME
        and isinstance(data.get("sha256"), str)
        and _SHA256.fullmatch(data["sha256"])
        and isinstance(data.get("bytes"), int)
    ):
        raise ValueError(
            f"sidecar {str(sidecar)!r} is not an h5forge sidecar: need format={FORMAT_NAME!r}, "
            "a 64-hex sha256 and an integer bytes"
        )
    return data


def sidecar_bytes(sha: str, size: int, fields: dict[str, Any]) -> bytes:
    """The sidecar JSON; every recorded string goes through redaction first."""
    counts = fields.pop("counts", {}) if "counts" in fields else {}
    scrubbed = redact_storage_options({k: v for k, v in fields.items() if k != "source"})
    sidecar: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": fields.get("format_version", _DEFAULT_FORMAT_VERSION),
        "sha256": sha,
        "bytes": size,
        "counts": counts,  # class names may look like secret keys ("key"): kept verbatim
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": redact_url(str(fields.get("source", ""))),
    }
    for key, value in scrubbed.items():
        sidecar.setdefault(key, REDACTED if is_sensitive_key(key) else value)
    return json.dumps(sidecar, indent=2, sort_keys=True).encode()
