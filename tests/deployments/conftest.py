"""Fixtures for the deployment tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from h5forge.demo import make_demo_archive
from tests.deployments._processes import free_port, prefect_env


@pytest.fixture(scope="module")
def demo_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The built-in demo dataset (a deterministic ``.tar.gz`` of JPEGs and PNGs with two broken
    files), written once per module; returns the archive's path."""
    return str(make_demo_archive(tmp_path_factory.mktemp("demo-source")))


def h5forge_cli(
    *args: str, env: dict[str, str], timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the console script (``python -m h5forge.deployments.cli``) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "h5forge.deployments.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


@dataclass(frozen=True)
class LocalServer:
    """A server started by ``h5forge server start``: its environment (``PREFECT_HOME``, no
    ``PREFECT_API_URL``) and its API URL."""

    env: dict[str, str]
    url: str
    home: Path


@contextlib.contextmanager
def local_server(home: Path) -> Iterator[LocalServer]:
    """``h5forge server start`` on a free port under ``home``; stopped (and, failing that,
    killed through its state file) at the end."""
    env = prefect_env(None, home)
    port = free_port()
    started = h5forge_cli("server", "start", "--port", str(port), env=env)
    state = home / "h5forge-server" / "server.json"
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield LocalServer(env, f"http://127.0.0.1:{port}/api", home)
    finally:
        if state.exists():
            pid = json.loads(state.read_text())["pid"]
            h5forge_cli("server", "stop", env=env)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def h5forge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """One ``h5forge server start`` server for a test module."""
    with local_server(tmp_path_factory.mktemp("h5forge-server")) as server:
        yield server
