"""The HTTP(S) downloader: streaming, timeouts, retries with backoff and jitter, Range resume.

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

This module is the attempt loop and its bounds; opening a response (headers, redirects, the
head's watchdog) is :mod:`h5forge.fetch.connect`, reading its body :mod:`h5forge.fetch.body`.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import ssl
import time
from collections.abc import Mapping
from pathlib import Path

from h5forge.errors import DownloadRefusedError
from h5forge.fetch.body import Limits, Retry, State, accept, restart, stream, trailing, why
from h5forge.fetch.cache import create_part
from h5forge.fetch.connect import check_headers, open_response
from h5forge.progress import Progress, progress_bar
from h5forge.redact import redact_text, redact_url

__all__ = ["download"]

log = logging.getLogger("h5forge.fetch.sources")

_MAX_DELAY = 30.0


def _check_status(resp: http.client.HTTPResponse, shown: str) -> None:
    status = resp.status
    if status in (200, 206):
        return
    reason = f"HTTP {status} {resp.reason}".strip()
    if status >= 500 or status in (408, 425, 429):
        after = resp.getheader("Retry-After", "")
        raise Retry(reason, delay=min(float(after), 60.0) if after.isdigit() else None)
    if status in (404, 410):
        raise FileNotFoundError(f"{reason} for {shown!r}: no file at that URL; check the URL")
    if status in (401, 403):
        raise PermissionError(
            f"{reason} for {shown!r}: access denied; check the credentials or the signed URL"
        )
    raise DownloadRefusedError(
        f"{reason} for {shown!r}: the server refused the request (not retried); check the URL"
    )


def _attempt(url: str, st: State, lim: Limits, caller: dict[str, str], bar: Progress) -> None:
    shown = redact_url(url)
    own = {"Accept-Encoding": "identity", "User-Agent": "h5forge", "Connection": "close"}
    if st.have:
        own["Range"] = f"bytes={st.have}-"
        if st.validator:
            own["If-Range"] = st.validator
    try:
        conn, resp, sock = open_response(url, own, caller, lim.timeout, st.deadline)
    except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
        raise Retry(why(exc), timeout=isinstance(exc, TimeoutError)) from exc
    except ssl.SSLCertVerificationError as exc:
        raise OSError(
            f"the TLS certificate of {shown!r} is not trusted ({exc.verify_message}); "
            "check the URL or the system's CA certificates"
        ) from exc
    except OSError as exc:
        if exc.errno is None and not isinstance(exc, ssl.SSLError):
            raise  # our own, already clear (a refused redirect ...)
        # DNS failure, network unreachable, TLS handshake cut: worth another attempt.
        raise Retry(f"cannot connect ({why(exc)})") from exc
    try:
        if resp.status == 416 and st.have:  # the file shrank or changed: start over
            restart(st)
            raise Retry("HTTP 416 on resume")
        _check_status(resp, shown)
        end = accept(resp, st, lim, shown)
        start = st.have
        if not resp.chunked:
            resp.length = None  # we frame the body ourselves, to see bytes past its end
        bar.reset(st.have, st.total)
        stream(resp, sock, st, lim, shown, end, bar)
        if end is not None and st.have == end and trailing(resp, sock):
            restart(st)
            raise Retry(f"the server sent more bytes than the {end - start} it declared")
    finally:
        resp.close()
        conn.close()
    if end is not None and st.have < end:
        raise Retry(f"connection closed after {st.have} of the {end} bytes declared")
    if st.total is not None and st.have != st.total:
        raise Retry(f"connection dropped after {st.have} of {st.total} bytes")


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
        FileNotFoundError, PermissionError: HTTP 404/410, 401/403 (names the URL).
        DownloadRefusedError: another non-retryable HTTP answer, or a redirect not followed
            (out of http(s), or too many; names the hop ``from -> to``).
        UnsafeArchiveError: over ``max_bytes``.
        TimeoutError, ConnectionError: a bound reached (names the URL, the bound and its
            option, bytes received and the time spent, and the last failure).
    """
    shown = redact_url(url)
    caller = check_headers(headers or {})
    started = time.monotonic()
    fd = create_part(out)
    with (
        os.fdopen(fd, "wb") as file,
        progress_bar(progress, f"download {shown.rsplit('/', 1)[-1]}") as bar,
    ):
        st = State(file=file, deadline=started + lim.total_timeout)
        failures = attempts = 0
        while True:
            attempts += 1
            try:
                _attempt(url, st, lim, caller, bar)
                file.flush()
                return st.digest.hexdigest(), st.have
            except Retry as exc:
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
    exc: Retry,
    st: State,
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
