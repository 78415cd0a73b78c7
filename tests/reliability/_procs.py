"""Subprocess helpers for the campaigns: one Prefect server, and ``h5forge`` commands that can be
watched line by line and killed at a chosen moment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["REPO", "Watched", "base_env", "prefect_server", "run_cli"]

REPO = Path(__file__).resolve().parents[2]


def base_env(work: Path, api_url: str | None) -> dict[str, str]:
    """Environment of a campaign subprocess: its own TMPDIR and PREFECT_HOME, no analytics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    tmp = work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "TMPDIR": str(tmp),
            "PREFECT_HOME": str(work / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
            "COLUMNS": "200",
        }
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prefect_server(work: Path, *, timeout: float = 120.0) -> Iterator[tuple[str, float]]:
    """``prefect server start`` on a free loopback port with a throw-away database.

    Yields ``(api_url, seconds it took to become healthy)``; stops the server on exit.
    """
    port = _free_port()
    env = base_env(work, None)
    env["PREFECT_SERVER_UI_ENABLED"] = "false"
    log = open(work / "prefect-server.log", "wb")  # noqa: SIM115 - closed below
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-ui",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=work,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"prefect server exited with {proc.returncode}; see "
                    f"{work / 'prefect-server.log'}"
                )
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"prefect server not healthy after {timeout} s")
            time.sleep(0.25)
        yield url, time.perf_counter() - t0
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@dataclass
class Watched:
    """A running command whose merged stdout/stderr lines are collected with timestamps."""

    proc: subprocess.Popen[bytes]
    t0: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def start_reader(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                self.lines.append(
                    (time.perf_counter() - self.t0, raw.decode("utf-8", "replace").rstrip("\n"))
                )

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def wait_for(self, needle: str, timeout: float) -> float | None:
        """Seconds since start when a line containing ``needle`` arrived (None: never/exited)."""
        deadline = time.perf_counter() + timeout
        seen = 0
        while time.perf_counter() < deadline:
            lines = self.lines
            for t, line in lines[seen:]:
                if needle in line:
                    return t
            seen = len(lines)
            if (
                self.proc.poll() is not None
                and self._reader is not None
                and not self._reader.is_alive()
            ):
                return None
            time.sleep(0.002)
        return None

    def kill(self) -> None:
        """SIGKILL the whole process group (the build, its workers, its children)."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self, timeout: float | None = None) -> int:
        """Wait for the exit (killing the group when ``timeout`` passes); the exit status."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        finally:
            if self._reader is not None:
                self._reader.join(timeout=5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return rc

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> Watched:
    """Start ``python -m h5forge.deployments.cli ARGS`` (the ``h5forge`` script), own group."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "h5forge.deployments.cli", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    w = Watched(proc, time.perf_counter())
    w.start_reader()
    return w
