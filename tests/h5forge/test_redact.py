"""Redaction of URLs, free text and storage_options."""

from __future__ import annotations

import pytest

from h5forge.redact import canonical_url, redact_storage_options, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:pw@host.example/a.tar", "https://host.example/a.tar"),
        ("https://user@host.example:8443/a", "https://host.example:8443/a"),
        (
            "https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIA%2F2026&X-Amz-Signature=abc123&X-Amz-Security-Token=tok",
            "https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Security-Token=REDACTED",
        ),
        (
            "https://storage.googleapis.com/b/o?GoogleAccessId=sa%40p&Expires=17&Signature=s%2B",
            "https://storage.googleapis.com/b/o?GoogleAccessId=REDACTED&Expires=REDACTED"
            "&Signature=REDACTED",
        ),
        (
            "https://acct.blob.core.windows.net/c/x?sv=2024&sig=zz",
            "https://acct.blob.core.windows.net/c/x?sv=2024&sig=REDACTED",
        ),
        (
            "https://h/x?access_token=t&page=2#token=f",
            "https://h/x?access_token=REDACTED&page=2#token=REDACTED",
        ),
        ("s3://bucket/key.tar", "s3://bucket/key.tar"),
        ("/local/path/with@at?.tar", "/local/path/with@at?.tar"),
        ("http://[::1", "http://REDACTED"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_canonical_url_ignores_credentials_and_signatures() -> None:
    a = canonical_url("HTTPS://u:p@Host.Example/a.tar?X-Amz-Signature=1&v=2")
    b = canonical_url("https://host.example/a.tar?v=2&X-Amz-Signature=other")
    assert a == b == "https://host.example/a.tar?v=2"


def test_redact_text_and_storage_options() -> None:
    text = "failed GET https://u:secret@h/x?sig=abc (retry 2) and s3://b/k"
    assert redact_text(text) == "failed GET https://h/x?sig=REDACTED (retry 2) and s3://b/k"
    options = {
        "key": "AKIA",
        "secret": "s",
        "token": {"client_email": "x", "private_key": "p"},
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://u:pw@127.0.0.1:9000", "region_name": "eu"},
        "account_key": "k",
        "session": object(),
        "retries": 3,
    }
    assert redact_storage_options(options) == {
        "key": "REDACTED",
        "secret": "REDACTED",
        "token": "REDACTED",
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu"},
        "account_key": "REDACTED",
        "session": "REDACTED",
        "retries": 3,
    }
    assert redact_storage_options(None) == {}
