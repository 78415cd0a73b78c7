"""Opening one HTTP(S) response: caller headers checked, redirects followed, the head bounded.

Caller headers, and Basic auth from the URL's userinfo, go only to the origin (scheme, host,
port) they were given for, and never again once a redirect has left it. At most
:data:`MAX_REDIRECTS` redirects are followed, to http(s) URLs only; any other redirect raises
:class:`~h5forge.errors.DownloadRefusedError` naming the hop (``from -> to``). A watchdog shuts
the socket down when the response head (TLS handshake included) takes longer than its bound,
which a per-read timeout cannot enforce against a server trickling a byte at a time.
"""

from __future__ import annotations

import base64
import http.client
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from urllib.parse import unquote, urljoin, urlsplit

from h5forge.errors import DownloadRefusedError
from h5forge.redact import redact_url

__all__ = ["MAX_REDIRECTS", "check_headers", "open_response"]

log = logging.getLogger("h5forge.fetch.sources")

MAX_REDIRECTS = 5
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


def open_response(
    url: str, own: dict[str, str], caller: dict[str, str], timeout: float, deadline: float
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, socket.socket]:
    """GET ``url`` following at most ``MAX_REDIRECTS`` http(s) redirects.

    ``own`` headers (set by the downloader) go to every hop. ``caller`` headers, and Basic auth
    from userinfo in the URL, go only to the first URL's origin, and never again once a
    redirect has left it (also when a later redirect comes back). Each hop must deliver its
    response head within ``timeout`` seconds, and before ``deadline`` (``time.monotonic()``
    seconds). The socket is returned too: ``http.client`` drops the connection's reference to
    it when the answer says ``Connection: close``, but the body is still read from it.

    Raises:
        DownloadRefusedError: a redirect to a URL that is not http(s) with a host, or more than
            ``MAX_REDIRECTS`` of them; the message names the refused hop, redacted.
        OSError: ``url`` itself is not an http(s) URL with a host.
    """
    asked, first = url, urlsplit(url)
    origin = _origin(url)
    extra = dict(caller)
    if first.username is not None:  # userinfo wins over a caller's Authorization header
        extra = {k: v for k, v in extra.items() if k.lower() != "authorization"}
        extra["Authorization"] = _basic(first.username, first.password or "")
    came_from = ""  # the URL whose answer redirected to ``url``
    for hop in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            if hop:
                raise DownloadRefusedError(
                    f"refusing to follow a redirect {_hop(came_from, url)}: only http(s) URLs "
                    "with a host are followed; ask the server owner for a direct http(s) URL"
                )
            raise OSError(f"cannot download {redact_url(url)!r}: not an http(s) URL with a host")
        if _origin(url) != origin:
            extra = {}  # sticky: a redirect back to the origin gets no caller headers either
        wait = max(min(timeout, deadline - time.monotonic()), 0.001)
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
        came_from, url = url, urljoin(url, location)
    raise DownloadRefusedError(
        f"too many redirects (> {MAX_REDIRECTS}) for {redact_url(asked)!r}; the one "
        f"refused: {_hop(came_from, url)}; ask the server owner for the final http(s) URL"
    )


def _hop(came_from: str, to: str) -> str:
    """``'FROM' -> 'TO'``, both redacted (a redirect may carry a signed URL's secrets)."""
    return f"{redact_url(came_from)!r} -> {redact_url(to)!r}"


def _basic(user: str, password: str) -> str:
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return f"Basic {token}"
