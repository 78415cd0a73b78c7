"""One Ctrl-C stops ``python -m h5forge.deployments.serve``, within a bound, whether its Prefect
server still answers (the schedules are paused on the way out) or has stopped (the process says
the schedules were not paused, or stops without waiting for it): one SIGINT to a real serve
process, against a real server.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h5forge.cli.exits import EXIT_INTERRUPTED
from h5forge.deployments.serve import ON_DEMAND
from h5forge.deployments.stopping import SHUTDOWN_GRACE_S
from tests.deployments._processes import (
    BUILD_FLOW,
    api_get,
    child_process,
    log_tail,
    prefect_env,
    prefect_server,
    wait_until,
)

# What a stop may take besides the grace: the interpreter's exit, a loaded machine.
_SLACK_S = 20.0


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("server", ["answers", "stopped"])
def test_one_ctrl_c_stops_serve(tmp_path: Path, server: str) -> None:
    log = tmp_path / "serve.log"
    with contextlib.ExitStack() as running:
        api_url = running.enter_context(prefect_server(tmp_path))
        env = prefect_env(api_url, tmp_path / "serve-home", H5FORGE_SCHEDULES="off")
        with child_process(
            [sys.executable, "-m", "h5forge.deployments.serve"], env=env, log=log
        ) as proc:
            wait_until(
                lambda: "being served" in log.read_text(encoding="utf-8", errors="replace"),
                timeout=120, what="serve starting", proc=proc, log=log,
            )  # fmt: skip
            if server == "stopped":
                running.close()  # the server goes; serve is still running
                assert proc.poll() is None, log_tail(log)
            os.kill(proc.pid, signal.SIGINT)  # once
            try:
                code = proc.wait(timeout=SHUTDOWN_GRACE_S + _SLACK_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"serve still running after one SIGINT\n{log_tail(log)}")
            if server == "answers":
                deployment = api_get(api_url, f"/deployments/name/{BUILD_FLOW}/{ON_DEMAND}")
                assert deployment.json()["paused"] is True, log_tail(log)  # Ctrl-C paused them
    lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln]
    assert code == EXIT_INTERRUPTED, log_tail(log)
    # No uncaught exception at the end (Prefect's own log lines may quote a traceback).
    assert not re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", lines[-1]), log_tail(log, 120)
