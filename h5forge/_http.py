"""Private HTTP(S) downloader: streaming, timeouts, retries with backoff and jitter, Range resume.

Why ``http.client`` and not fsspec's ``HTTPFileSystem`` (aiohttp): resuming safely needs the
status and ``Content-Range`` of every response and the exact number of bytes kept before a drop,
and a stalled server must fail after ``timeout`` seconds of silence. ``http.client`` gives all of
that synchronously — a socket timeout per blocking read, no event-loop thread inside Prefect
workers, no extra dependency — in a few dozen lines. fsspec's HTTP ``get_file`` restarts from
zero and hides partial responses. Not supported: HTTP proxies (we read no environment).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import random
import re
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from h5forge._progress import Progress, progress_bar
from h5forge.redact import redact_text, redact_url

__all__: list[str] = []

log = logging.getLogger("h5forge.sources")

_CHUNK = 1 << 20
_MAX_REDIRECTS = 5
_MAX_DELAY = 30.0
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _Retry(Exception):
    """A transient failure: the attempt may be repeated (resuming where it stopped)."""

    def __init__(self, reason: str, *, timeout: bool = False, delay: float | None = None) -> None:
        super().__init__(reason)
        self.timeout = timeout
        self.delay = delay


@dataclass
class _State:
    """What survives between attempts: bytes kept, running digest, resume validator."""

    have: int = 0
    received: int = 0  # bytes received over all attempts (progress, even across restarts)
    total: int | None = None
    validator: str | None = None
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)


def _open(
    url: str, headers: dict[str, str], timeout: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """GET ``url`` following redirects.

    Userinfo in the URL becomes Basic auth. Credentials (userinfo, ``Authorization`` and
    ``Cookie`` headers) are sent only to the origin they were given for, never after a
    redirect to another scheme, host or port.
    """
    first = urlsplit(url)
    origin = (first.scheme, first.hostname, first.port)
    sent = dict(headers)
    if first.username is not None:
        sent["Authorization"] = _basic(first.username, first.password or "")
    for _ in range(_MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OSError(f"cannot download {redact_url(url)!r}: not an http(s) URL with a host")
        if (parts.scheme, parts.hostname, parts.port) != origin:
            sent = {k: v for k, v in sent.items() if k.lower() not in ("authorization", "cookie")}
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request("GET", path, headers=sent)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        location = resp.getheader("Location")
        if resp.status not in (301, 302, 303, 307, 308) or not location:
            return conn, resp
        resp.close()
        conn.close()
        url = urljoin(url, location)
    raise OSError(f"too many redirects (> {_MAX_REDIRECTS}) for {redact_url(url)!r}")


def _basic(user: str, password: str) -> str:
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return f"Basic {token}"


def _check_status(resp: http.client.HTTPResponse, shown: str) -> None:
    status = resp.status
    if status in (200, 206):
        return
    reason = f"HTTP {status} {resp.reason}".strip()
    if status >= 500 or status in (408, 425, 429):
        after = resp.getheader("Retry-After", "")
        raise _Retry(reason, delay=min(float(after), 60.0) if after.isdigit() else None)
    if status in (404, 410):
        raise FileNotFoundError(f"{reason} for {shown!r}: no file at that URL; check the URL")
    if status in (401, 403):
        raise PermissionError(
            f"{reason} for {shown!r}: access denied; check the credentials or the signed URL"
        )
    raise OSError(f"{reason} for {shown!r}: the server refused the request (not retried)")


def _restart(st: _State, out: Path) -> None:
    """Forget every byte kept so far: the next bytes start the file again."""
    st.have, st.total, st.validator, st.digest = 0, None, None, hashlib.sha256()
    out.write_bytes(b"")


def _accept(resp: http.client.HTTPResponse, st: _State, out: Path) -> None:
    """Decide how this response continues the download; reset the state when it restarts."""
    if resp.status == 206:
        match = _CONTENT_RANGE.fullmatch(resp.getheader("Content-Range", "").strip())
        total = None if match is None or match[3] == "*" else int(match[3])
        if match is None or int(match[1]) != st.have or (st.total and total != st.total):
            _restart(st, out)  # not the continuation we asked for
            raise _Retry(f"bad resume answer (Content-Range {resp.getheader('Content-Range')!r})")
        st.total = total
        return
    # 200: the whole body, whether or not we asked for a range (a server may ignore Range).
    if st.have:
        log.info("server ignored the Range request; restarting from byte 0")
    _restart(st, out)
    length = resp.getheader("Content-Length")
    st.total = int(length) if length and length.isdigit() else None
    etag = resp.getheader("ETag")
    st.validator = etag if etag and not etag.startswith("W/") else resp.getheader("Last-Modified")


def _attempt(
    url: str, out: Path, st: _State, timeout: float, headers: dict[str, str], bar: Progress
) -> None:
    shown = redact_url(url)
    headers = {"Accept-Encoding": "identity", "User-Agent": "h5forge", **headers}
    if st.have:
        headers["Range"] = f"bytes={st.have}-"
        if st.validator:
            headers["If-Range"] = st.validator
    try:
        conn, resp = _open(url, headers, timeout)
    except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
        raise _Retry(f"{type(exc).__name__}: {exc}", timeout=isinstance(exc, TimeoutError)) from exc
    try:
        if resp.status == 416 and st.have:  # the file shrank or changed: start over
            _restart(st, out)
            raise _Retry("HTTP 416 on resume")
        _check_status(resp, shown)
        _accept(resp, st, out)
        bar.reset(st.have, st.total)
        with out.open("ab") as f:
            while True:
                try:
                    block = resp.read1(_CHUNK)  # whatever has arrived: no bytes lost on a stall
                except http.client.IncompleteRead as exc:
                    block = exc.partial
                    f.write(block)
                    st.have += len(block)
                    st.received += len(block)
                    st.digest.update(block)
                    raise _Retry(f"connection dropped after {st.have} bytes") from exc
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    kind = type(exc).__name__
                    raise _Retry(
                        f"{kind} after {st.have} bytes: {exc}",
                        timeout=isinstance(exc, TimeoutError),
                    ) from exc
                if not block:
                    break
                f.write(block)
                st.have += len(block)
                st.received += len(block)
                st.digest.update(block)
                bar.advance(len(block))
    finally:
        resp.close()
        conn.close()
    if st.total is not None and st.have != st.total:
        raise _Retry(f"connection dropped after {st.have} of {st.total} bytes")


def download(
    url: str,
    out: Path,
    *,
    retries: int,
    timeout: float,
    backoff: float,
    progress: bool,
    headers: dict[str, str] | None = None,
) -> tuple[str, int]:
    """Download ``url`` into the local file ``out``, resuming after drops.

    ``retries`` bounds consecutive failed attempts that made no progress; an attempt that kept
    new bytes resets the count, so a long download survives many drops.

    Returns:
        ``(sha256 hex digest, size in bytes)`` of what was written.

    Raises:
        FileNotFoundError, PermissionError, OSError: a non-retryable HTTP answer (names the URL).
        TimeoutError, ConnectionError: retries exhausted (names the URL and the last failure).
    """
    shown = redact_url(url)
    st = _State()
    out.write_bytes(b"")
    failures = 0
    with progress_bar(progress, f"download {shown.rsplit('/', 1)[-1]}") as bar:
        while True:
            before = st.received
            try:
                _attempt(url, out, st, timeout, dict(headers or {}), bar)
                return st.digest.hexdigest(), st.have
            except _Retry as exc:
                failures = 0 if st.received > before else failures + 1
                reason = redact_text(str(exc))
                if failures > retries:
                    kind = TimeoutError if exc.timeout else ConnectionError
                    raise kind(
                        f"download of {shown!r} failed after {failures} attempts without "
                        f"progress (retries={retries}, timeout={timeout}s): {reason}"
                    ) from exc
                delay = min(backoff * 2 ** max(failures - 1, 0), _MAX_DELAY)
                delay = delay / 2 + random.uniform(0, delay / 2)  # jitter spreads retry storms
                if exc.delay is not None:
                    delay = max(delay, exc.delay)
                log.warning(
                    "retrying %s in %.2fs at byte %d after: %s", shown, delay, st.have, reason
                )
                time.sleep(delay)
