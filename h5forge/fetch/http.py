"""Private HTTP(S) downloader: streaming, timeouts, retries with backoff and jitter, Range resume.

Why ``http.client`` and not fsspec's ``HTTPFileSystem`` (aiohttp): resuming safely needs the
status and ``Content-Range`` of every response and the exact number of bytes kept before a drop,
and a stalled server must fail after ``timeout`` seconds of silence. ``http.client`` gives all of
that synchronously — a socket timeout per blocking read, no event-loop thread inside Prefect
workers, no extra dependency — in a few dozen lines. fsspec's HTTP ``get_file`` restarts from
zero and hides partial responses. Not supported: HTTP proxies (we read no environment).

The server is untrusted, so every resource it could make us spend is bounded by a limit the
caller controls (see :class:`Limits`): bytes (``max_bytes``, counted as they arrive, whatever
the headers say), attempts (a total cap, and a cap on failures in a row that make no progress —
re-downloading bytes already fetched once is not progress), time (an idle timeout per read, a
deadline for the response head, a minimum rate, a total deadline). Content is never decoded
(``Accept-Encoding: identity``; a ``Content-Encoding`` answer is stored as sent), so a
compression bomb is just its compressed bytes. Caller headers go only to the origin they were
given for.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import os
import random
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urljoin, urlsplit

from h5forge.errors import UnsafeArchiveError
from h5forge.progress import Progress, progress_bar
from h5forge.redact import redact_text, redact_url

__all__: list[str] = []

log = logging.getLogger("h5forge.fetch.sources")

_CHUNK = 1 << 20
_MAX_REDIRECTS = 5
_MAX_DELAY = 30.0
_TRAILING_WAIT = 0.2  # how long to look for bytes past the declared end of a body
_NUM = r"\d{1,19}"  # bounded: int() of a 5,000-digit header value raises, and no file is that big
_CONTENT_RANGE = re.compile(rf"bytes ({_NUM})-({_NUM})/({_NUM}|\*)")
_LENGTH = re.compile(_NUM)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Headers the downloader owns: a caller's value would corrupt framing, resuming or decoding.
_RESERVED = frozenset(
    {
        "accept-encoding",
        "connection",
        "content-length",
        "expect",
        "host",
        "if-range",
        "keep-alive",
        "proxy-connection",
        "range",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


@dataclass(frozen=True)
class Limits:
    """Bounds of one download (``fetch`` documents each; all validated there)."""

    retries: int  # failed attempts in a row without progress
    timeout: float  # seconds of silence per read; also the bound on a response head
    backoff: float  # first retry delay; doubles per failure, with jitter
    max_bytes: int  # most bytes accepted, over the whole download
    max_attempts: int  # most attempts in all, progress or not
    total_timeout: float  # seconds for the whole download, retries and waits included
    min_rate: float  # bytes/s averaged over each ``timeout`` seconds of body; 0 disables


class _Retry(Exception):
    """A transient failure: the attempt may be repeated (resuming where it stopped).

    ``slow``: the attempt failed the minimum-rate rule; it counts as a failure without
    progress even if it kept bytes, or a trickle could reset the count forever.
    """

    def __init__(
        self, reason: str, *, timeout: bool = False, delay: float | None = None, slow: bool = False
    ) -> None:
        super().__init__(reason)
        self.timeout = timeout or slow
        self.delay = delay
        self.slow = slow


@dataclass
class _State:
    """What survives between attempts: bytes kept, running digest, resume validator."""

    file: BinaryIO
    have: int = 0
    best: int = 0  # the most bytes ever kept: only passing it counts as progress
    received: int = 0  # bytes received over all attempts (progress, even across restarts)
    total: int | None = None
    validator: str | None = None
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    deadline: float = 0.0


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Validate caller headers up front; returns them as a plain dict.

    Raises:
        ValueError: a name that is not an HTTP token, a value with CR, LF or NUL or outside
            Latin-1, or a header the downloader sets itself (``Range``, ``Host`` ...).
    """
    out: dict[str, str] = {}
    for name, value in headers.items():
        name, value = str(name), str(value)
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP token; fix the name")
        if name.lower() in _RESERVED:
            raise ValueError(
                f"header {name!r} may not be set: the downloader sets it itself "
                "(framing, resume and decoding); remove it from headers"
            )
        if any(c in value for c in "\r\n\0") or not value.isascii() and not _latin1(value):
            raise ValueError(
                f"header {name!r} has a value with CR, LF, NUL or non-Latin-1 "
                "characters; fix the value"
            )
        out[name] = value
    return out


def _latin1(value: str) -> bool:
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, parts.hostname, parts.port or default


class _Watchdog:
    """Shuts a connection's socket down after ``seconds``: bounds what a read timeout cannot.

    A TLS handshake or a response head trickled a byte at a time (or an endless run of
    ``100 Continue``) never leaves any read silent for ``timeout`` seconds; shutting the
    socket down ends the read. It watches the TCP socket from the moment it exists (hooked
    into ``http.client``'s socket factory), so the handshake is covered too.
    """

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        make = conn._create_connection  # type: ignore[attr-defined]

        def create(*args: object, **kwargs: object) -> socket.socket:
            sock: socket.socket = make(*args, **kwargs)
            with self._lock:
                self._sock = sock
                fired = self.fired
            if fired:  # the time ran out while connecting
                self._shut(sock)
            return sock

        conn._create_connection = create  # type: ignore[attr-defined]
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._sock
        if sock is not None:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already closed: the read it would end has ended
            log.debug("watchdog: socket already closed (%s)", exc)

    def cancel(self) -> None:
        self._timer.cancel()


def _open(
    url: str, own: dict[str, str], caller: dict[str, str], timeout: float, st: _State
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, socket.socket]:
    """GET ``url`` following at most ``_MAX_REDIRECTS`` http(s) redirects.

    ``own`` headers (set by the downloader) go to every hop. ``caller`` headers, and Basic auth
    from userinfo in the URL, go only to the first URL's origin, and never again once a
    redirect has left it (also when a later redirect comes back). Each hop must deliver its
    response head within ``timeout`` seconds (and before the download's deadline). The socket
    is returned too: ``http.client`` drops the connection's reference to it when the answer
    says ``Connection: close``, but the body is still read from it.
    """
    first = urlsplit(url)
    origin = _origin(url)
    extra = dict(caller)
    if first.username is not None:  # userinfo wins over a caller's Authorization header
        extra = {k: v for k, v in extra.items() if k.lower() != "authorization"}
        extra["Authorization"] = _basic(first.username, first.password or "")
    for hop in range(_MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            if hop:
                raise UnsafeArchiveError(
                    f"refusing to follow a redirect to {redact_url(url)!r}: only http(s) URLs "
                    "with a host are followed; ask the server owner for a direct http(s) URL"
                )
            raise OSError(f"cannot download {redact_url(url)!r}: not an http(s) URL with a host")
        if _origin(url) != origin:
            extra = {}  # sticky: a redirect back to the origin gets no caller headers either
        wait = max(min(timeout, st.deadline - time.monotonic()), 0.001)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=wait, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=wait)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = {k: v for k, v in own.items() if k.lower() not in {e.lower() for e in extra}}
        dog = _Watchdog(conn, wait)
        try:
            conn.connect()
            sock = conn.sock  # the TLS socket for https
            assert sock is not None
            conn.request("GET", path, headers={**sent, **extra})
            resp = conn.getresponse()
        except BaseException as exc:
            conn.close()
            if dog.fired:
                raise TimeoutError(f"no complete response head within {wait:.1f}s") from exc
            raise
        finally:
            dog.cancel()
        location = resp.getheader("Location")
        if resp.status not in (301, 302, 303, 307, 308) or not location:
            return conn, resp, sock
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


def _restart(st: _State) -> None:
    """Forget every byte kept so far: the next bytes start the file again."""
    st.have, st.total, st.validator, st.digest = 0, None, None, hashlib.sha256()
    st.file.seek(0)
    st.file.truncate()


def over_max_bytes(shown: str, what: str, max_bytes: int) -> UnsafeArchiveError:
    """The error for a download past ``max_bytes`` (``what``: how we know it is)."""
    return UnsafeArchiveError(
        f"download of {shown!r} {what}, over max_bytes={max_bytes}; nothing was kept — "
        "raise max_bytes if the source is trusted"
    )


def _accept(resp: http.client.HTTPResponse, st: _State, lim: Limits, shown: str) -> int | None:
    """Decide how this response continues the download; reset the state when it restarts.

    Returns the byte count the file must reach when this body ends, or None when the body
    runs until the connection closes (no ``Content-Length``, or chunked).
    """
    length_header = None if resp.chunked else resp.getheader("Content-Length")
    if length_header is not None and not _LENGTH.fullmatch(length_header.strip()):
        raise _Retry(f"invalid Content-Length {length_header[:40]!r}")
    length = None if length_header is None else int(length_header)
    if resp.status == 206:
        got = resp.getheader("Content-Range", "").strip()
        match = _CONTENT_RANGE.fullmatch(got)
        if match is None:
            raise _Retry(f"bad resume answer (Content-Range {got[:80]!r})")
        start, end = int(match[1]), int(match[2])
        total = None if match[3] == "*" else int(match[3])
        claimed = max(end + 1, total or 0)
        if claimed > lim.max_bytes:  # final whatever else the answer says: it is over the cap
            raise over_max_bytes(
                shown, f"declares {claimed} bytes (Content-Range {got[:80]!r})", lim.max_bytes
            )
        # An unknown total ("*") is refused too: the download could not tell when it is done.
        if (
            start != st.have
            or end < start
            or total is None
            or end >= total
            or (st.total and total != st.total)
            or (length is not None and length != end - start + 1)
        ):
            # Not the continuation we asked for (also a 206 to a request without Range that
            # does not start at 0): start over, and the attempt made no progress.
            asked = st.have
            _restart(st)
            raise _Retry(
                f"bad resume answer (Content-Range {got[:80]!r} to a request from byte {asked})"
            )
        st.total = total
        return end + 1
    # 200: the whole body, whether or not we asked for a range (a server may ignore Range).
    if st.have:
        log.info("server ignored the Range request; restarting from byte 0")
    _restart(st)
    if length is not None and length > lim.max_bytes:
        raise over_max_bytes(shown, f"declares {length} bytes (Content-Length)", lim.max_bytes)
    st.total = length
    etag = resp.getheader("ETag")
    st.validator = etag if etag and not etag.startswith("W/") else resp.getheader("Last-Modified")
    return length


def _trailing(resp: http.client.HTTPResponse, sock: socket.socket) -> bool:
    """Whether bytes follow the declared end of the body (a ``Content-Length`` that lied).

    We asked for ``Connection: close``, so a correct server closes right after the body; a
    server that keeps the connection open anyway is given ``_TRAILING_WAIT`` seconds.
    """
    if resp.fp is None:
        return False
    try:
        sock.settimeout(_TRAILING_WAIT)
        if resp.chunked:  # http.client still frames it: one more byte means more data
            return bool(resp.read1(1))
        return bool(resp.fp.peek(1))
    except (OSError, ValueError, http.client.HTTPException):  # timed out, reset or closed
        return False


def _attempt(url: str, st: _State, lim: Limits, caller: dict[str, str], bar: Progress) -> None:
    shown = redact_url(url)
    own = {"Accept-Encoding": "identity", "User-Agent": "h5forge", "Connection": "close"}
    if st.have:
        own["Range"] = f"bytes={st.have}-"
        if st.validator:
            own["If-Range"] = st.validator
    try:
        conn, resp, sock = _open(url, own, caller, lim.timeout, st)
    except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
        raise _Retry(_why(exc), timeout=isinstance(exc, TimeoutError)) from exc
    except ssl.SSLCertVerificationError as exc:
        raise OSError(
            f"the TLS certificate of {shown!r} is not trusted ({exc.verify_message}); "
            "check the URL or the system's CA certificates"
        ) from exc
    except OSError as exc:
        if exc.errno is None and not isinstance(exc, ssl.SSLError):
            raise  # our own, already clear (too many redirects ...)
        # DNS failure, network unreachable, TLS handshake cut: worth another attempt.
        raise _Retry(f"cannot connect ({_why(exc)})") from exc
    try:
        if resp.status == 416 and st.have:  # the file shrank or changed: start over
            _restart(st)
            raise _Retry("HTTP 416 on resume")
        _check_status(resp, shown)
        end = _accept(resp, st, lim, shown)
        start = st.have
        if not resp.chunked:
            resp.length = None  # we frame the body ourselves, to see bytes past its end
        bar.reset(st.have, st.total)
        _stream(resp, sock, st, lim, shown, end, bar)
        if end is not None and st.have == end and _trailing(resp, sock):
            _restart(st)
            raise _Retry(f"the server sent more bytes than the {end - start} it declared")
    finally:
        resp.close()
        conn.close()
    if end is not None and st.have < end:
        raise _Retry(f"connection closed after {st.have} of the {end} bytes declared")
    if st.total is not None and st.have != st.total:
        raise _Retry(f"connection dropped after {st.have} of {st.total} bytes")


def _stream(
    resp: http.client.HTTPResponse,
    sock: socket.socket,
    st: _State,
    lim: Limits,
    shown: str,
    end: int | None,
    bar: Progress,
) -> None:
    """Append the body to the file, enforcing ``max_bytes``, the rate and the deadline."""
    window_start, window_bytes = time.monotonic(), 0
    while True:
        want = _CHUNK if end is None else min(_CHUNK, end - st.have)
        want = min(want, lim.max_bytes + 1 - st.have)  # one byte past the cap is enough to know
        if want <= 0:
            return
        # No read may wait past the download's deadline.
        sock.settimeout(max(min(lim.timeout, st.deadline - time.monotonic()), 0.001))
        try:
            block = resp.read1(want)  # whatever has arrived: no bytes lost on a stall
        except http.client.IncompleteRead as exc:
            if st.have + len(exc.partial) > lim.max_bytes:
                raise over_max_bytes(
                    shown, f"sent more than {lim.max_bytes} bytes", lim.max_bytes
                ) from exc
            _keep(st, exc.partial, bar)
            raise _Retry(f"connection dropped after {st.have} bytes") from exc
        except (http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            raise _Retry(
                f"{_why(exc)} after {st.have} bytes", timeout=isinstance(exc, TimeoutError)
            ) from exc
        if not block:
            return
        if st.have + len(block) > lim.max_bytes:
            raise over_max_bytes(shown, f"sent more than {lim.max_bytes} bytes", lim.max_bytes)
        _keep(st, block, bar)
        now = time.monotonic()
        if now >= st.deadline:
            raise _Retry(f"total_timeout reached at byte {st.have}", timeout=True)
        window_bytes += len(block)
        if now - window_start >= lim.timeout:
            if window_bytes < lim.min_rate * (now - window_start):
                raise _Retry(
                    f"too slow: {window_bytes} bytes in {now - window_start:.1f}s, "
                    f"under min_rate={lim.min_rate:g} B/s",
                    slow=True,
                )
            window_start, window_bytes = now, 0


def _why(exc: BaseException) -> str:
    """``Kind: text`` without the raw ``[Errno N]`` prefix of OS errors."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{type(exc).__name__}: {text}"


def _keep(st: _State, block: bytes, bar: Progress) -> None:
    st.file.write(block)
    st.have += len(block)
    st.received += len(block)
    st.digest.update(block)
    bar.advance(len(block))


def download(
    url: str, out: Path, *, lim: Limits, progress: bool, headers: Mapping[str, str] | None = None
) -> tuple[str, int]:
    """Download ``url`` into the new local file ``out``, resuming after drops.

    ``out`` is created exclusively (never through a link) and only ever written through that
    one handle. ``lim.retries`` bounds failed attempts in a row that made no progress (kept no
    byte past the most ever kept); ``lim.max_attempts`` bounds attempts in all and
    ``lim.total_timeout`` the whole download.

    Returns:
        ``(sha256 hex digest, size in bytes)`` of what was written.

    Raises:
        FileNotFoundError, PermissionError, OSError: a non-retryable HTTP answer (names the URL).
        UnsafeArchiveError: over ``max_bytes``, or a redirect to a non-http(s) URL.
        TimeoutError, ConnectionError: a bound reached (names the URL, the bound and its
            option, bytes received and the time spent, and the last failure).
    """
    shown = redact_url(url)
    caller = check_headers(headers or {})
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    started = time.monotonic()
    try:
        fd = os.open(out, flags, 0o666)
    except FileExistsError as exc:
        raise FileExistsError(
            f"download file {str(out)!r} already exists (perhaps as a link); "
            "refusing to write through it — remove it and retry"
        ) from exc
    with (
        os.fdopen(fd, "wb") as file,
        progress_bar(progress, f"download {shown.rsplit('/', 1)[-1]}") as bar,
    ):
        st = _State(file=file, deadline=started + lim.total_timeout)
        failures = attempts = 0
        while True:
            attempts += 1
            try:
                _attempt(url, st, lim, caller, bar)
                file.flush()
                return st.digest.hexdigest(), st.have
            except _Retry as exc:
                progressed = st.have > st.best and not exc.slow
                st.best = max(st.best, st.have)
                failures = 0 if progressed else failures + 1
                delay = min(lim.backoff * 2 ** max(failures - 1, 0), _MAX_DELAY)
                delay = delay / 2 + random.uniform(0, delay / 2)  # jitter spreads retry storms
                if exc.delay is not None:
                    delay = max(delay, exc.delay)
                _give_up(shown, exc, st, lim, failures, attempts, started, delay)
                log.warning(
                    "retrying %s in %.2fs at byte %d after: %s",
                    shown,
                    delay,
                    st.have,
                    redact_text(str(exc)),
                )
                time.sleep(delay)


def _give_up(
    shown: str,
    exc: _Retry,
    st: _State,
    lim: Limits,
    failures: int,
    attempts: int,
    started: float,
    delay: float,
) -> None:
    """Raise when a bound is reached; the message says which, and the option that sets it."""
    elapsed = time.monotonic() - started
    kind: type[OSError]
    if time.monotonic() + delay >= st.deadline:
        why, kind = f"did not finish within total_timeout={lim.total_timeout:g}s", TimeoutError
    elif attempts >= lim.max_attempts:
        why = f"gave up after max_attempts={lim.max_attempts} attempts"
        kind = TimeoutError if exc.timeout else ConnectionError
    elif failures > lim.retries:
        why = (
            f"failed after {failures} attempts in a row without progress "
            f"(retries={lim.retries}, timeout={lim.timeout:g}s, min_rate={lim.min_rate:g} B/s)"
        )
        kind = TimeoutError if exc.timeout else ConnectionError
    else:
        return
    raise kind(
        f"download of {shown!r} {why}: received {st.received} bytes in {elapsed:.1f}s over "
        f"{attempts} attempts, kept {st.have}; last failure: {redact_text(str(exc))} — "
        "retry later, or raise the option named if the server is merely slow"
    ) from exc
