"""Prefect's temporary local API server for one ``h5forge build`` or ``demo``, ended with it.

Without ``PREFECT_API_URL`` Prefect starts a server itself ("ephemeral mode") and waits 20 s for
it. Both fall short for a first run: a first start creates the server's SQLite database, which
took longer than 20 s on a busy 2-core machine, and the server is a plain child process that
outlives a ``kill -9`` of the command (it kept running, holding its port and database). So the
console script starts the same server the same way (uvicorn over
``prefect.server.api.server:create_app`` with the UI and background services off, as Prefect's
ephemeral mode does) and:

- waits up to a bound fit for a first start on a loaded machine, saying what it waits for and
  how long it has waited;
- asks the kernel to send the server SIGKILL when the command dies, however it dies
  (``PR_SET_PDEATHSIG`` on Linux), and stops it gracefully (SIGTERM, then SIGKILL after 15 s)
  when the command exits, after Prefect has delivered the run's last logs and events. The
  signal on death is SIGKILL, not SIGTERM: uvicorn's graceful shutdown took more than 10 s
  on a 2-core machine at a load of 7-9 (4 of 5 trials), so the orphan outlived the command;
  its SQLite database survives a SIGKILL (the campaign kills whole process groups, server
  included, and every re-run passes);
- on failure names the setting that bounds the wait and the persistent-server alternative, with
  the server's exit status and the last lines it printed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = [
    "STARTUP_SETTING",
    "ServerStartError",
    "healthy",
    "server_command",
    "start_temporary_server",
]

# The setting Prefect itself reads for its temporary server's start-up bound; honoured here too.
STARTUP_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
_PR_SET_PDEATHSIG = 1
# How often the wait says it is still waiting.
_SAY_EVERY_S = 15.0


class ServerStartError(RuntimeError):
    """Prefect's temporary server did not become healthy; the message says what to do."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    """Whether the Prefect API at ``url`` answers its health check."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _tail(log: Any, lines: int = 8) -> str:
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    return " | ".join(line for line in text.strip().splitlines()[-lines:])


def _failure(what: str, timeout_s: float, log: Any) -> ServerStartError:
    said = _tail(log)
    return ServerStartError(
        f"Prefect's temporary local server {what}; nothing was run or published. On a slow or "
        f"busy machine raise the bound, e.g. {STARTUP_SETTING}=600 (it was {timeout_s:.0f} s), "
        "or run a persistent server: `prefect server start` in another shell, then "
        "`export PREFECT_API_URL=http://127.0.0.1:4200/api` and run this again."
        + (f" The server printed: {said}" if said else "")
    )


def server_command(port: int, *, log_level: str) -> list[str]:
    """The command line of a Prefect API server on loopback ``port`` (uvicorn over Prefect's
    app factory, as Prefect's own temporary server); its environment says what it serves."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        log_level,
        "--lifespan",
        "on",
    ]


def start_temporary_server(timeout_s: float, say: Callable[[str], None]) -> str:
    """Start the server and point ``PREFECT_API_URL`` at it; it stops when this process exits.

    It is stopped by an ``atexit`` hook registered before Prefect is first used, so it runs
    after Prefect's own exit hooks (they run last-registered first) have delivered the run's
    last logs and events to it. Call this before importing Prefect, whose settings read
    ``PREFECT_API_URL`` when they are first built.

    Args:
        timeout_s: how long to wait for it to become healthy.
        say: where progress lines go (the command's stderr).

    Returns:
        The API URL.

    Raises:
        ServerStartError: it exited or did not answer within ``timeout_s`` (it is stopped).
    """
    url = f"http://127.0.0.1:{_free_port()}/api"
    port = url.rsplit(":", 1)[1].split("/")[0]
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _stop
    proc = subprocess.Popen(
        server_command(int(port), log_level="error"),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
    )  # the command has started no thread yet
    atexit.register(_stop, proc, log)
    say(
        f"starting Prefect's temporary local server on {url} (waiting up to {timeout_s:.0f} s; "
        "a first start on a machine also creates its database) ..."
    )
    t0 = time.monotonic()
    next_say = t0 + _SAY_EVERY_S
    while not healthy(url):
        failure = None
        if proc.poll() is not None:
            failure = _failure(
                f"exited with status {proc.returncode} while starting", timeout_s, log
            )
        elif time.monotonic() - t0 > timeout_s:
            failure = _failure(
                f"did not answer within {timeout_s:.0f} s ({STARTUP_SETTING})", timeout_s, log
            )
        if failure is not None:
            _stop(proc, log)
            raise failure
        if time.monotonic() >= next_say:
            say(f"still waiting for Prefect's temporary server ({time.monotonic() - t0:.0f} s) ...")
            next_say = time.monotonic() + _SAY_EVERY_S
        time.sleep(0.2)
    say(f"Prefect's temporary server is up after {time.monotonic() - t0:.1f} s")
    os.environ["PREFECT_API_URL"] = url
    return url


def _stop(proc: subprocess.Popen[bytes], log: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
