"""Spawn-safe by construction, tried as users run it: real scripts and real signals.

- a script that calls ``build_dataset`` from its module level (directly or through its
  ``main()``) fails before anything starts, with the ``if __name__ == "__main__":`` fix (the
  check in a child importing the script again: tests/h5forge/test_main_guard.py);
- the same script with the guard builds, and the temporary server it needed ends with the call;
- Ctrl-C (SIGINT to the process group) during a build, or a pool worker killed with SIGKILL,
  ends the command with a clear message and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge.demo import write_image_folder
from tests.deployments._processes import REPO_ROOT, prefect_env
from tests.deployments.conftest import LocalServer
from tests.fixtures.processes import descendants, survivors

pytestmark = pytest.mark.slow

_FIX = 'if __name__ == "__main__":'

_HEAD = f"""\
import json, multiprocessing, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from h5forge.flows.build import BuildConfig, build_dataset
from tests.fixtures.processes import descendants


def main():
    summary = build_dataset(BuildConfig(source=sys.argv[1], destination=sys.argv[2]))
    left = [open(f"/proc/{{p}}/cmdline").read() for p in descendants(os.getpid())]
    print(json.dumps({{"samples": summary.num_samples, "children": left}}))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("spawn-src")
    write_image_folder(src, classes=("a", "b"), per_class=6, seed=5, size=(32, 32))
    return src


def _script(
    tmp_path: Path, tail: str, source: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "user_script.py"
    script.write_text(_HEAD + tail)
    dest = tmp_path / "out" / "x.h5"
    run = subprocess.run(
        [sys.executable, str(script), str(source), str(dest)],
        env=env, capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )  # fmt: skip
    return run, dest


@pytest.mark.parametrize(
    "call",
    ["build_dataset(BuildConfig(source=sys.argv[1], destination=sys.argv[2]))", "main()"],
    ids=["direct", "via-main"],
)
def test_a_module_level_build_under_spawn_fails_at_once(
    tmp_path: Path, source: Path, call: str
) -> None:
    tail = f'multiprocessing.set_start_method("spawn")\n{call}\n'
    run, dest = _script(tmp_path, tail, source, prefect_env(None, tmp_path / "home"))
    assert run.returncode == 1
    error = "h5forge.errors.MainReimportError: build_dataset() was called from the module"
    assert any(line.startswith(error) for line in run.stderr.splitlines()), run.stderr
    assert _FIX in run.stderr
    assert "Starting temporary server" not in run.stdout + run.stderr  # nothing started
    assert not dest.exists()


def test_the_guarded_script_builds_and_its_server_ends_with_the_call(
    tmp_path: Path, source: Path
) -> None:
    tail = f'\n{_FIX}\n    multiprocessing.set_start_method("spawn")\n    main()\n'
    run, dest = _script(tmp_path, tail, source, prefect_env(None, tmp_path / "home"))
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["samples"] == 12
    assert dest.exists()
    # Still in the script, after the call: Prefect's server is gone (multiprocessing's own
    # resource tracker may remain until the interpreter exits).
    assert not [c for c in out["children"] if "uvicorn" in c], out["children"]


def _pool_workers(pid: int) -> list[int]:
    """The decode pool's workers under ``pid``: children of its fork server."""
    found = []
    tree = descendants(pid)
    for p in tree:
        try:
            with open(f"/proc/{p}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                if b"forkserver" in f.read() and parent in tree:
                    found.append(p)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("how", ["ctrl-c", "worker killed"])
def test_an_interrupted_build_leaves_no_process_behind(
    tmp_path: Path, h5forge_server: LocalServer, how: str
) -> None:
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=150, seed=2, size=(256, 256))
    # A terminal's foreground job has Ctrl-C's default action; a test runner started in the
    # background of a script has SIGINT ignored, which its children would inherit (Python then
    # never raises KeyboardInterrupt): the build starts as the terminal would start it.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        build = subprocess.Popen(
            [sys.executable, "-m", "h5forge.deployments.cli", "build", str(src),
             str(tmp_path / "out" / "x.h5"), "--workers", "2"],
            env=h5forge_server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
    finally:
        if ignored is not None:
            signal.signal(signal.SIGINT, ignored)
    try:
        deadline = time.monotonic() + 240
        while not (workers := _pool_workers(build.pid)):
            assert build.poll() is None, build.communicate()
            assert time.monotonic() < deadline, "the pack's pool never started"
            time.sleep(0.02)
        tree = descendants(build.pid)
        if how == "ctrl-c":
            os.killpg(build.pid, signal.SIGINT)  # what a terminal sends the foreground group
        else:
            os.kill(workers[0], signal.SIGKILL)
        _, err = build.communicate(timeout=120)
    finally:
        if build.poll() is None:  # hung: end it, and read (and close) its pipes
            os.killpg(build.pid, signal.SIGKILL)
            build.communicate()
    last = err.strip().splitlines()[-1]
    if how == "ctrl-c":
        assert build.returncode == 130, err
        assert last == "error: interrupted (Ctrl-C) before the build finished", err
    else:
        assert build.returncode == 1, err
        assert last.startswith(
            "error: build failed, nothing was published: BrokenProcessPool: a worker process "
            "died while processing inputs"
        ), err
        assert "__main__" not in last  # the console script has its guard: no such advice
    assert "Traceback" not in err, err
    assert not survivors(tree, within=15), "processes outlived the build"
    assert not (tmp_path / "out" / "x.h5").exists()
