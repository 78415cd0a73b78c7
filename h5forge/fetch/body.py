"""Reading one HTTP response body into a download: resume checked, bounds enforced, hashed.

:func:`accept` decides how a response continues the download (a ``206`` must continue exactly
where the kept bytes end, else the download starts over; a ``200`` is the whole body), and
:func:`stream` appends its body, counting ``max_bytes`` as bytes arrive, holding the minimum
rate and the deadline, and seeing bytes past a declared end. A transient failure is a
:class:`Retry`; what survives between attempts is the :class:`State`.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import re
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import BinaryIO

from h5forge.errors import UnsafeArchiveError
from h5forge.progress import Progress

__all__ = [
    "Limits",
    "Retry",
    "State",
    "accept",
    "over_max_bytes",
    "restart",
    "stream",
    "trailing",
    "why",
]


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


log = logging.getLogger("h5forge.fetch.sources")

_CHUNK = 1 << 20
_TRAILING_WAIT = 0.2  # how long to look for bytes past the declared end of a body
_NUM = r"\d{1,19}"  # bounded: int() of a 5,000-digit header value raises, and no file is that big
_CONTENT_RANGE = re.compile(rf"bytes ({_NUM})-({_NUM})/({_NUM}|\*)")
_LENGTH = re.compile(_NUM)


class Retry(Exception):
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
class State:
    """What survives between attempts: bytes kept, running digest, resume validator."""

    file: BinaryIO
    have: int = 0
    best: int = 0  # the most bytes ever kept: only passing it counts as progress
    received: int = 0  # bytes received over all attempts (progress, even across restarts)
    total: int | None = None
    validator: str | None = None
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    deadline: float = 0.0


def restart(st: State) -> None:
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


def accept(resp: http.client.HTTPResponse, st: State, lim: Limits, shown: str) -> int | None:
    """Decide how this response continues the download; reset the state when it restarts.

    Returns the byte count the file must reach when this body ends, or None when the body
    runs until the connection closes (no ``Content-Length``, or chunked).
    """
    length_header = None if resp.chunked else resp.getheader("Content-Length")
    if length_header is not None and not _LENGTH.fullmatch(length_header.strip()):
        raise Retry(f"invalid Content-Length {length_header[:40]!r}")
    length = None if length_header is None else int(length_header)
    if resp.status == 206:
        got = resp.getheader("Content-Range", "").strip()
        match = _CONTENT_RANGE.fullmatch(got)
        if match is None:
            raise Retry(f"bad resume answer (Content-Range {got[:80]!r})")
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
            restart(st)
            raise Retry(
                f"bad resume answer (Content-Range {got[:80]!r} to a request from byte {asked})"
            )
        st.total = total
        return end + 1
    # 200: the whole body, whether or not we asked for a range (a server may ignore Range).
    if st.have:
        log.info("server ignored the Range request; restarting from byte 0")
    restart(st)
    if length is not None and length > lim.max_bytes:
        raise over_max_bytes(shown, f"declares {length} bytes (Content-Length)", lim.max_bytes)
    st.total = length
    etag = resp.getheader("ETag")
    st.validator = etag if etag and not etag.startswith("W/") else resp.getheader("Last-Modified")
    return length


def trailing(resp: http.client.HTTPResponse, sock: socket.socket) -> bool:
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


def stream(
    resp: http.client.HTTPResponse,
    sock: socket.socket,
    st: State,
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
            raise Retry(f"connection dropped after {st.have} bytes") from exc
        except (http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            raise Retry(
                f"{why(exc)} after {st.have} bytes", timeout=isinstance(exc, TimeoutError)
            ) from exc
        if not block:
            return
        if st.have + len(block) > lim.max_bytes:
            raise over_max_bytes(shown, f"sent more than {lim.max_bytes} bytes", lim.max_bytes)
        _keep(st, block, bar)
        now = time.monotonic()
        if now >= st.deadline:
            raise Retry(f"total_timeout reached at byte {st.have}", timeout=True)
        window_bytes += len(block)
        if now - window_start >= lim.timeout:
            if window_bytes < lim.min_rate * (now - window_start):
                raise Retry(
                    f"too slow: {window_bytes} bytes in {now - window_start:.1f}s, "
                    f"under min_rate={lim.min_rate:g} B/s",
                    slow=True,
                )
            window_start, window_bytes = now, 0


def why(exc: BaseException) -> str:
    """``Kind: text`` without the raw ``[Errno N]`` prefix of OS errors."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{type(exc).__name__}: {text}"


def _keep(st: State, block: bytes, bar: Progress) -> None:
    st.file.write(block)
    st.have += len(block)
    st.received += len(block)
    st.digest.update(block)
    bar.advance(len(block))
