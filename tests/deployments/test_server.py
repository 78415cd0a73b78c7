"""``h5forge server start|status|stop`` and ``build`` finding the server, as real processes.

Every test runs the console script in subprocesses with its own ``PREFECT_HOME`` and no
``PREFECT_API_URL``, the way a user's shell runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from h5forge.demo import write_image_folder
from tests.deployments._processes import BUILD_FLOW, prefect_env
from tests.deployments.conftest import LocalServer, h5forge_cli, local_server

pytestmark = pytest.mark.slow


def _state(home: Path) -> Path:
    return home / "h5forge-server" / "server.json"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=4, seed=3, size=(32, 32))
    return src


def test_start_status_stop_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with local_server(home) as server:
        state = json.loads(_state(home).read_text())
        assert state["url"] == server.url
        status = h5forge_cli("server", "status", env=server.env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"pid {state['pid']}" in status.stdout
        assert server.url in status.stdout
        assert server.url.removesuffix("/api") in status.stdout  # the UI
        assert h5forge_cli("server", "status", "--url", env=server.env).stdout == server.url + "\n"
        again = h5forge_cli("server", "start", env=server.env)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stdout
        assert json.loads(_state(home).read_text()) == state  # the same server, not a second
        # Its UI knows its API (a port other than 4200 needs PREFECT_UI_API_URL).
        settings = httpx.get(server.url.removesuffix("/api") + "/ui-settings", timeout=10)
        assert settings.json()["api_url"] == server.url
        stopped = h5forge_cli("server", "stop", env=server.env)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped the h5forge server (pid {state['pid']})" in stopped.stdout
        assert not _alive(state["pid"])
        assert not _state(home).exists()
        after = h5forge_cli("server", "status", env=server.env)
        assert after.returncode == 1
        assert "not running" in after.stdout


def test_build_uses_the_running_server(h5forge_server: LocalServer, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "x.h5"
    run = h5forge_cli(
        "build", str(_source(tmp_path)), str(dest), env=h5forge_server.env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    ui = h5forge_server.url.removesuffix("/api")
    assert f"using the h5forge server at {ui}" in run.stderr
    assert "h5forge server start" not in run.stderr  # no advice when it is in use
    assert "temporary" not in run.stderr
    flow_runs = httpx.post(
        f"{h5forge_server.url}/flow_runs/filter",
        json={"flows": {"name": {"any_": [BUILD_FLOW]}}},
        timeout=30,
    ).json()
    completed = [r["id"] for r in flow_runs if r["state_type"] == "COMPLETED"]
    assert completed, flow_runs
    # The link the run printed leads to that run on the server that is still up.
    assert any(f"View at {ui}/runs/flow-run/{i}" in run.stderr for i in completed), run.stderr
    assert dest.exists()


@pytest.mark.parametrize("differs", ["token", "start time"])
def test_stop_refuses_a_pid_it_did_not_start(tmp_path: Path, differs: str) -> None:
    home = tmp_path / "home"
    _state(home).parent.mkdir(parents=True)
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with open(f"/proc/{foreign.pid}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        _state(home).write_text(
            json.dumps(
                {
                    "pid": foreign.pid,
                    "port": 4200,
                    "url": "http://127.0.0.1:4200/api",
                    "token": "not-its-token" if differs == "token" else "",
                    "started": started if differs == "token" else started - 1,
                    "log": str(_state(home).parent / "server.log"),
                }
            )
        )
        run = h5forge_cli("server", "stop", env=prefect_env(None, home))
        assert run.returncode == 1, run.stdout + run.stderr
        assert f"pid {foreign.pid} is not the server" in run.stderr
        assert "left it running" in run.stderr
        assert foreign.poll() is None, "stop killed a process it did not start"
        assert not _state(home).exists(), "the stale state file is still there"
    finally:
        foreign.kill()
        foreign.wait()


def _stale(home: Path) -> int:
    """A state file naming a process that has exited; its pid."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    pid = int(gone.stdout)
    _state(home).parent.mkdir(parents=True)
    _state(home).write_text(
        json.dumps(
            {
                "pid": pid,
                "port": 4200,
                "url": "http://127.0.0.1:4200/api",
                "token": "t",
                "started": 1,
                "log": str(home / "server.log"),
            }
        )  # fmt: skip
    )
    return pid


def test_a_stale_state_file_reads_as_no_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pid = _stale(home)
    env = prefect_env(None, home)
    status = h5forge_cli("server", "status", env=env)
    assert status.returncode == 1
    assert f"not running (its state file names pid {pid}, now gone)" in status.stdout
    stop = h5forge_cli("server", "stop", env=env)
    assert stop.returncode == 0, stop.stderr
    assert "already exited" in stop.stdout
    assert not _state(home).exists()


def test_build_with_a_stale_server_falls_back_and_says_once_how_to_get_one(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _stale(home)
    run = h5forge_cli(
        "build", str(_source(tmp_path)), str(tmp_path / "out" / "x.h5"),
        env=prefect_env(None, home), cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("h5forge server start") == 1, run.stderr
    assert "starting Prefect's temporary local server" in run.stderr
