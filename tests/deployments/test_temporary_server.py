"""``h5forge build``'s own temporary Prefect server: its start-up bound, its messages, its end.

Each test runs the real console script in a subprocess with no ``PREFECT_API_URL`` and a fresh
``PREFECT_HOME``, so the command starts the server itself, as on a user's first run.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge.demo import write_image_folder

pytestmark = pytest.mark.slow

_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def _build(tmp_path: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "src"
    if not src.exists():
        write_image_folder(src, classes=("a", "b"), per_class=3, seed=1, size=(32, 32))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            **env_extra,
        }
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "h5forge.deployments.cli",
            "build",
            str(src),
            str(tmp_path / "out" / "x.h5"),
            "--cache-dir",
            str(tmp_path / "c"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_server_that_does_not_start_in_time_names_the_setting_and_is_stopped(
    tmp_path: Path,
) -> None:
    run = _build(tmp_path, **{_SETTING: "0.5"})
    assert run.returncode == 1, run.stderr
    assert "waiting up to 0 s" in run.stderr or "waiting up to 1 s" in run.stderr
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("error: Prefect's temporary local server did not answer within")
    for named in (_SETTING, "prefect server start", "PREFECT_API_URL"):
        assert named in error
    assert "Traceback" not in run.stderr
    found = re.search(r"http://127\.0\.0\.1:(\d+)/api", run.stderr)
    assert found, run.stderr
    port = int(found.group(1))
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(port), "the temporary server outlived the command"
    assert not (tmp_path / "out" / "x.h5").exists()


def test_a_bound_that_is_not_a_number_is_a_usage_error(tmp_path: Path) -> None:
    run = _build(tmp_path, **{_SETTING: "soon"})
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {_SETTING}=soon is not a number of seconds"
    )
    assert "starting Prefect" not in run.stderr
