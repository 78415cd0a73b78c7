"""Checks of the URLs and addresses a build is given: a known fsspec protocol, no secrets,
writable where the flow writes; a Dask scheduler address."""

from __future__ import annotations

import re

import fsspec

from h5forge.redact import redact_url

__all__ = ["check_dask_address", "check_url"]

# A Dask scheduler address: tcp:// or tls://, a host name, IPv4 or [IPv6] address, and a port.
_DASK_ADDRESS = re.compile(
    r"^(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$"
)
# fsspec can read these but not write them.
_READ_ONLY = frozenset({"http", "https", "github", "zip", "tar", "libarchive", "reference"})


def check_url(url: str, *, what: str, writable: bool = False) -> str:
    """Check that ``url`` is a local path or a URL of a protocol fsspec knows, without secrets.

    Raises:
        ValueError: empty, unknown protocol, read-only protocol for a destination, or embedded
            credentials (they belong in a Secret block, not in a parameter Prefect records).
    """
    url = url.strip()
    if not url:
        raise ValueError(f"{what} is empty; give a local path or a URL such as s3://bucket/key")
    if redact_url(url) != url:
        raise ValueError(
            f"{what} {redact_url(url)!r} embeds credentials (user:password@ or a signed token); "
            "store them in a Prefect Secret block and name it in credentials_block"
        )
    if "://" not in url:
        return url
    known = set(fsspec.available_protocols())
    for part in url.split("::"):
        protocol = part.split("://", 1)[0].lower() if "://" in part else part.lower()
        if protocol not in known:
            raise ValueError(
                f"{what} {url!r} uses protocol {protocol!r}, which fsspec does not know; use a "
                f"local path or one of {', '.join(sorted(p for p in known if len(p) <= 6))} ..."
            )
        if writable and protocol in _READ_ONLY:
            raise ValueError(
                f"{what} {url!r}: protocol {protocol!r} is read-only in fsspec; publish to a "
                "local path or a writable store (s3://, gs://, az://, memory://, ...)"
            )
    return url


def check_dask_address(value: str | None) -> str | None:
    """``tcp://HOST:PORT`` or ``tls://HOST:PORT`` stripped, or None when empty.

    Raises:
        ValueError: not a Dask scheduler address, or a port outside 1..65535.
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    match = _DASK_ADDRESS.match(value)
    if not match or not 1 <= int(match.group(3)) <= 65535:
        raise ValueError(
            f"dask_address {value!r} is not a Dask scheduler address: expected "
            "tcp://HOST:PORT or tls://HOST:PORT with a port 1..65535, e.g. "
            "tcp://scheduler:8786 (what `dask scheduler` prints)"
        )
    return value
