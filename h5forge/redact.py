"""Redaction of credentials from URLs, free text and ``storage_options`` before they are recorded.

Everything h5forge records — log lines, error messages, Prefect artifacts, HDF5 attributes,
sidecars — goes through these helpers first. Redaction removes the secret but keeps the shape
of the value, so a redacted URL still says which host and object were involved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "REDACTED",
    "canonical_url",
    "is_sensitive_key",
    "redact_storage_options",
    "redact_text",
    "redact_url",
]

REDACTED = "REDACTED"

# Query/fragment parameter names (lower-case) whose value is a secret or part of a signature.
# Covers AWS SigV2/V4 presigned URLs, GCS signed URLs (V2 and V4), Azure SAS, CloudFront
# signed URLs and OAuth-style bearer tokens in query strings.
_SENSITIVE_PARAMS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "x-goog-signature",
        "x-goog-credential",
        "x-goog-security-token",
        "signature",
        "sig",
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "awsaccesskeyid",
        "googleaccessid",
        "expires",
        "policy",
        "key-pair-id",
        "key",
        "api_key",
        "apikey",
        "password",
        "passwd",
        "secret",
        "client_secret",
        "code",
    }
)

# Substrings of storage_options keys (lower-case) that hold secrets, e.g. "key", "secret",
# "token", "password", "account_key", "sas_token", "connection_string", "client_secret".
_SENSITIVE_KEY_PARTS = (
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "signature",
    "connection_string",
    "auth",
    "session",
    "private",
    "sas",
)

# A scheme followed by "://" and everything up to whitespace or a closing quote/bracket.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}]+")


def _redact_params(raw: str) -> str:
    """Replace the value of every sensitive ``k=v`` pair in a raw query or fragment string.

    Works on the raw text so that non-sensitive parameters are kept byte for byte.
    """
    pieces = []
    for piece in raw.split("&"):
        name, sep, _value = piece.partition("=")
        if sep and unquote(name).strip().lower() in _SENSITIVE_PARAMS:
            piece = f"{name}={REDACTED}"
        pieces.append(piece)
    return "&".join(pieces)


def redact_url(url: str) -> str:
    """Return ``url`` with userinfo removed and signed-query tokens replaced by ``REDACTED``.

    ``https://user:pw@host/a.tar?X-Amz-Signature=abc&v=1`` becomes
    ``https://host/a.tar?X-Amz-Signature=REDACTED&v=1``. Plain paths and URLs without
    credentials are returned unchanged (the exact input string).

    Args:
        url: any URL or local path.

    Returns:
        The redacted URL, safe to log or record.
    """
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        # Malformed (e.g. an invalid IPv6 literal): drop everything that could carry secrets.
        scheme = url.split("://", 1)[0]
        return f"{scheme}://{REDACTED}"
    netloc = parts.netloc.rpartition("@")[2] if "@" in parts.netloc else parts.netloc
    query = _redact_params(parts.query) if parts.query else parts.query
    fragment = _redact_params(parts.fragment) if parts.fragment else parts.fragment
    if (netloc, query, fragment) == (parts.netloc, parts.query, parts.fragment):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def canonical_url(url: str) -> str:
    """Return a credential-free, normalised form of ``url`` for use as a cache key.

    Userinfo and signature parameters are dropped entirely (not just masked), the scheme and
    host are lower-cased, so a re-signed URL for the same object maps to the same key.

    Args:
        url: any URL or local path.

    Returns:
        The canonical URL string.
    """
    if "://" not in url:
        return url
    parts = urlsplit(redact_url(url))
    kept = [
        piece
        for piece in parts.query.split("&")
        if piece and unquote(piece.partition("=")[0]).strip().lower() not in _SENSITIVE_PARAMS
    ]
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, "&".join(kept), ""))


def redact_text(text: str) -> str:
    """Redact every URL that appears inside free text, such as an exception message.

    Args:
        text: any text.

    Returns:
        ``text`` with each embedded URL passed through :func:`redact_url`.
    """
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def is_sensitive_key(name: str) -> bool:
    """Whether a ``storage_options`` key (any nesting level) names a secret.

    Args:
        name: the option name, e.g. ``"secret"`` or ``"endpoint_url"``.

    Returns:
        True when the value must never be recorded.
    """
    lowered = name.lower()
    return any(part in lowered for part in _SENSITIVE_KEY_PARTS)


def _redact_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return redact_storage_options(value)
    if isinstance(value, (list, tuple)):
        return [_redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    # Credential objects, sessions and the like: never try to render them.
    return f"<{type(value).__name__}>"


def redact_storage_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return a copy of ``storage_options`` that is safe to log or record.

    Values under sensitive keys (``key``, ``secret``, ``token``, ``password``, ...) become
    ``REDACTED`` at any nesting level; URLs elsewhere (e.g. ``endpoint_url``) are redacted;
    arbitrary objects are replaced by their type name.

    Args:
        options: the ``storage_options`` mapping, or None.

    Returns:
        A new dict; ``{}`` for None.
    """
    if options is None:
        return {}
    out: dict[str, Any] = {}
    for name, value in options.items():
        key = str(name)
        if is_sensitive_key(key) and value is not None:
            # Whole sub-mappings too: a gcsfs service-account dict under "token" is one secret.
            out[key] = REDACTED
        else:
            out[key] = _redact_value(value)
    return out
