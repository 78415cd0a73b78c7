"""Process helpers for the deployment tests: a real Prefect server with its UI, a real
``python -m h5forge.deployments.serve`` runner, a real ``prefect worker``, all as subprocesses.

Every process runs in its own session and is torn down (SIGTERM, then SIGKILL) by the context
manager that started it, even when the test fails; its output goes to a log file whose tail is
attached to any startup error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
BUILD_FLOW = "build-h5-dataset"
VERIFY_FLOW = "verify-h5-asset"
WORK_POOL = "h5forge-process"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prefect_env(api_url: str | None, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process: this one's, pointed at ``api_url``, quiet, isolated
    (its own ``PREFECT_HOME``, and an ``XDG_CACHE_HOME`` so builds never fill ~/.cache)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        XDG_CACHE_HOME=str(home / "xdg-cache"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_RUNNER_POLL_FREQUENCY="1",
        PYTHONUNBUFFERED="1",
    )
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    if not path.exists():
        return f"(no log at {path})"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return f"--- last {min(lines, len(text))} lines of {path} ---\n" + "\n".join(text[-lines:])


@contextlib.contextmanager
def child_process(
    args: list[str], *, env: Mapping[str, str], log: Path, cwd: Path = REPO_ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` in a new session for the duration of the block; always tear it down."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield proc
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    # The process leads its own session: signal the group so flow-run children go too.
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    # Children of a process that already exited may still hold the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_until(
    condition: Callable[[], object],
    *,
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    interval: float = 0.5,
) -> object:
    """Poll ``condition`` until it returns something truthy; fail clearly on timeout or exit."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log) if log else ""
            raise RuntimeError(f"{what}: process exited with code {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            tail = log_tail(log) if log else ""
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s\n{tail}")
        time.sleep(interval)


def api_get(api_url: str, path: str) -> httpx.Response:
    """GET ``api_url + path`` with a short timeout; connection errors read as 503."""
    try:
        return httpx.get(f"{api_url}{path}", timeout=5.0)
    except httpx.TransportError:
        return httpx.Response(503)


def deployment_id(api_url: str, flow_name: str, deployment_name: str) -> str | None:
    """The id of ``flow_name/deployment_name`` on the server, or None while it is not there."""
    response = api_get(api_url, f"/deployments/name/{flow_name}/{deployment_name}")
    return str(response.json()["id"]) if response.status_code == 200 else None


def server_log(workdir: Path) -> Path:
    """Where :func:`prefect_server` started in ``workdir`` writes the server's output."""
    return workdir / "server.log"


@contextlib.contextmanager
def prefect_server(workdir: Path) -> Iterator[str]:
    """``prefect server start`` on a free loopback port, UI included; yields the API URL.

    ``PREFECT_UI_API_URL`` must name the same port, or the UI calls port 4200 and shows
    "Can't connect to Server API".

    On SQLite the server answers 503 when a write meets another connection's write ("database
    is locked"); ``PREFECT_API_LOG_RETRYABLE_ERRORS`` puts those in the log, which is otherwise
    silent about them.
    """
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(
        None, workdir / "server-home",
        PREFECT_UI_API_URL=api_url,
        PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false",
        PREFECT_API_LOG_RETRYABLE_ERRORS="true",
    )  # fmt: skip
    log = server_log(workdir)
    args = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with child_process(args, env=env, log=log) as proc:
        wait_until(
            lambda: api_get(api_url, "/health").status_code == 200,
            timeout=120, what="prefect server health", proc=proc, log=log,
        )  # fmt: skip
        yield api_url


@contextlib.contextmanager
def served_deployments(api_url: str, workdir: Path, **env: str) -> Iterator[Path]:
    """``python -m h5forge.deployments.serve`` against ``api_url``, schedules off; yields its log.

    Enters the block once the runner has registered (or updated) every deployment and says it
    is serving them.
    """
    log = workdir / "serve.log"
    child_env = prefect_env(api_url, workdir / "serve-home", H5FORGE_SCHEDULES="off", **env)
    with child_process(
        [sys.executable, "-m", "h5forge.deployments.serve"], env=child_env, log=log
    ) as p:
        wait_until(
            lambda: "being served" in log.read_text(encoding="utf-8", errors="replace"),
            timeout=120, what="h5forge.deployments.serve starting", proc=p, log=log,
        )  # fmt: skip
        yield log
