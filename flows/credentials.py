"""Storage credentials: read from a Prefect ``Secret`` block at run time, never from parameters."""

from __future__ import annotations

import json
from typing import Any

from prefect.blocks.system import Secret

__all__ = ["load_storage_options"]


def load_storage_options(block: str | None) -> dict[str, Any]:
    """The fsspec ``storage_options`` held by the Secret block named ``block`` (``{}`` for None).

    The block's value is a JSON object, e.g. ``{"key": "...", "secret": "...",
    "client_kwargs": {"endpoint_url": "https://..."}}``. The value is never logged.

    Raises:
        ValueError: no such block, or its value is not a JSON object.
    """
    if block is None:
        return {}
    value = Secret.load(block).get()  # type: ignore[union-attr]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            # Never echo the value: it is a secret, and may be one even when malformed.
            raise ValueError(
                f"Secret block {block!r} does not hold JSON; store the fsspec storage_options as "
                'a JSON object, e.g. {"key": "...", "secret": "..."}'
            ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"Secret block {block!r} holds a {type(value).__name__}, expected a JSON object of "
            "fsspec storage_options"
        )
    return value
