"""Checks of the URLs and addresses a build is given: a known fsspec protocol, no secrets,
writable where the flow writes (:func:`h5forge.preflight.check_url`, the one the command line
runs too); a Dask scheduler address."""

from __future__ import annotations

import re

from h5forge.preflight import check_url

__all__ = ["check_dask_address", "check_url"]

# A Dask scheduler address: tcp:// or tls://, a host name, IPv4 or [IPv6] address, and a port.
_DASK_ADDRESS = re.compile(
    r"^(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$"
)


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
