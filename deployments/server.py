"""``h5forge server start|status|stop``: one persistent local Prefect server, UI included.

``h5forge build`` and ``demo`` without ``PREFECT_API_URL`` otherwise start a temporary server
per command (18-29 s on a busy 2-core machine) whose "View at" links die with it. This one is
started once, detached (its own session, its own log), and found by ``build`` and ``demo``
(:func:`running_server`) through a state file in ``$PREFECT_HOME/h5forge-server/``, next to the
database it serves. The state file names the pid, port, URL, the process's start time and a
random token put in the server's environment; ``stop`` signals a pid only when both still match,
so it never kills a process that merely reused the pid.

It is the temporary server's command (uvicorn over ``prefect.server.api.server:create_app``,
analytics off) with the UI and the background services on, as ``prefect server start`` runs
them. A UI on a port other than 4200 needs ``PREFECT_UI_API_URL`` to name its API: it is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from h5forge.cli.exits import EXIT_FAILURE, EXIT_USAGE, fail
from h5forge.deployments.temporary_server import healthy, server_command

__all__ = ["DEFAULT_PORT", "ServerState", "app", "running_server", "state_dir"]

DEFAULT_PORT = 4200  # Prefect's own: the UI's links and docs assume it
_TOKEN_VAR = "H5FORGE_SERVER_TOKEN"
_STATE = "server.json"
_STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class ServerState:
    """What ``start`` wrote about the server it started."""

    pid: int
    port: int
    url: str
    token: str
    started: int  # the process's start time in clock ticks since boot (/proc/PID/stat)
    log: str

    @property
    def ui_url(self) -> str:
        return self.url.removesuffix("/api")


def state_dir(environ: Mapping[str, str]) -> Path:
    """``$PREFECT_HOME/h5forge-server`` (Prefect's default home: ``~/.prefect``)."""
    return Path(environ.get("PREFECT_HOME") or "~/.prefect").expanduser() / "h5forge-server"


def _read_state(folder: Path) -> ServerState | None:
    try:
        return ServerState(**json.loads((folder / _STATE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):  # unreadable or not ours: as if none
        return None


def _write_state(folder: Path, state: ServerState) -> None:
    tmp = folder / f".{_STATE}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(state), indent=1), encoding="utf-8")
    os.replace(tmp, folder / _STATE)


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _is_ours(state: ServerState) -> bool:
    """The pid is still the process ``start`` started: same start time, same token."""
    if _start_ticks(state.pid) != state.started:
        return False
    try:
        with open(f"/proc/{state.pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{_TOKEN_VAR}={state.token}".encode() in env


def running_server(environ: Mapping[str, str]) -> ServerState | None:
    """The server ``h5forge server start`` left running under this ``PREFECT_HOME``, if it
    answers its health check; else None."""
    state = _read_state(state_dir(environ))
    return state if state is not None and _is_ours(state) and healthy(state.url) else None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(
    environ: Mapping[str, str], port: int, timeout_s: float, say: Callable[[str], None]
) -> ServerState:
    folder = state_dir(environ)
    folder.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/api"
    token = secrets.token_hex(16)
    env = {k: v for k, v in environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_UI_API_URL=url,  # a UI on a port other than 4200 calls 4200 without it
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false",
        **{_TOKEN_VAR: token},
    )
    log = folder / "server.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            server_command(port, log_level="warning"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: survives this command and its terminal
        )
    started = _start_ticks(proc.pid)
    state = ServerState(proc.pid, port, url, token, started or 0, str(log))
    _write_state(folder, state)
    say(f"starting the h5forge Prefect server on {url} (waiting up to {timeout_s:.0f} s) ...")
    t0 = time.monotonic()
    while not healthy(url):
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            what = (
                f"exited with status {proc.returncode}"
                if proc.poll() is not None
                else f"did not answer within {timeout_s:.0f} s"
            )
            _stop(state)
            raise fail(f"the Prefect server {what}; its log: {log}", EXIT_FAILURE)
        time.sleep(0.3)
    proc.returncode = 0  # detached on purpose: not "still running" when this command exits
    return state


def _stop(state: ServerState) -> None:
    """SIGTERM to the server's session, SIGKILL after a grace period; remove the state file."""
    for sig, wait in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.pid, sig)
        deadline = time.monotonic() + wait
        while _start_ticks(state.pid) == state.started and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(state.pid, os.WNOHANG)  # our own child when start failed
            time.sleep(0.1)
        if _start_ticks(state.pid) != state.started:
            break
    with contextlib.suppress(FileNotFoundError):
        (Path(state.log).parent / _STATE).unlink()


app = typer.Typer(
    no_args_is_help=True,
    help="One persistent local Prefect server (UI included) that `build` and `demo` use.",
)


def _running(state: ServerState) -> str:
    return f"the h5forge server is running (pid {state.pid}): UI {state.ui_url}, API {state.url}"


def _say(line: str) -> None:
    typer.echo(line, err=True)


@app.command()
def start(
    port: Annotated[int, typer.Option(help="loopback port of the API and UI")] = DEFAULT_PORT,
    timeout: Annotated[
        float, typer.Option(help="seconds to wait for it (a first start creates its database)")
    ] = 180.0,
) -> None:
    """Start the server in the background; it runs until `h5forge server stop`."""
    if not sys.platform.startswith("linux"):  # it tells its process apart through /proc
        raise fail(
            f"h5forge server runs on Linux only (this is {sys.platform}); run `prefect server "
            "start` instead and export PREFECT_API_URL=http://127.0.0.1:4200/api",
            EXIT_USAGE,
        )
    environ = os.environ
    state = _read_state(state_dir(environ))
    if state is not None and _is_ours(state):
        up = "is already running" if healthy(state.url) else "was started and is not answering yet"
        typer.echo(f"the h5forge server {up} (pid {state.pid}): UI {state.ui_url}, API {state.url}")
        return
    if not 0 < port < 65536:
        raise fail(f"--port {port} is not a TCP port; give 1..65535", EXIT_USAGE)
    if not _port_free(port):
        raise fail(
            f"port {port} is in use (another Prefect server?); pick a free one: "
            f"h5forge server start --port {port + 1}",
            EXIT_USAGE,
        )
    state = _start(environ, port, timeout, _say)
    typer.echo(_running(state))
    typer.echo(f"log: {state.log}; stop it with `h5forge server stop`")


@app.command()
def status(
    url: Annotated[bool, typer.Option("--url", help="print only the API URL")] = False,
) -> None:
    """Say whether the server is up (exit 0) or not (exit 1), and where."""
    state = _read_state(state_dir(os.environ))
    if state is None or not _is_ours(state):
        gone = "" if state is None else f" (its state file names pid {state.pid}, now gone)"
        typer.echo(f"the h5forge server is not running{gone}; start it: h5forge server start")
        raise typer.Exit(EXIT_FAILURE)
    if not healthy(state.url):
        typer.echo(f"the h5forge server (pid {state.pid}) is not answering on {state.url}")
        raise typer.Exit(EXIT_FAILURE)
    if url:
        typer.echo(state.url)
        return
    typer.echo(_running(state))
    typer.echo(f"log: {state.log}")


@app.command()
def stop() -> None:
    """Stop the server that `h5forge server start` started, and remove its state file."""
    folder = state_dir(os.environ)
    state = _read_state(folder)
    if state is None:
        typer.echo("the h5forge server is not running")
        return
    if not _is_ours(state):
        (folder / _STATE).unlink(missing_ok=True)
        if _start_ticks(state.pid) is None:
            typer.echo(f"the h5forge server (pid {state.pid}) had already exited; state removed")
            return
        raise fail(
            f"pid {state.pid} is not the server `h5forge server start` started (its start time "
            "and token differ: the pid was reused); left it running and removed the stale "
            f"state file {folder / _STATE}",
            EXIT_FAILURE,
        )
    _stop(state)
    typer.echo(f"stopped the h5forge server (pid {state.pid})")
