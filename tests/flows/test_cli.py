"""``h5forge build`` and ``h5forge demo`` run as subprocesses, the way a person runs them.

The subprocesses report to the session's Prefect test server (``PREFECT_API_URL`` is set by the
``prefect_harness`` fixture): measured here, that saves the ~11-15 s each command would spend
starting its own temporary server, and the commands behave the same otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from h5forge.demo import write_bad_files, write_image_folder
from h5forge.verify import verify

pytestmark = pytest.mark.slow

_SCRIPT = Path(sys.executable).with_name("h5forge")


def h5forge(
    *args: str, cwd: Path, cache: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run the ``h5forge`` console script (the pyproject entry point)."""
    command = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "flows.cli"]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def small_folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, classes=("cat", "dog"), per_class=6, size=((40, 60), (40, 60)))
    return root


def test_demo_builds_publishes_and_prints_the_summary(prefect_harness: str, tmp_path: Path) -> None:
    run = h5forge("demo", cwd=tmp_path, cache=tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    dest = tmp_path / "h5forge-demo" / "demo.h5"
    for line in (f"asset:       {dest}", "samples:     300 in 4 classes, 2 quarantined",
                 "sha256:", f"manifest:    {dest}.manifest.json",
                 f"preview:     {dest}.preview.png", "smoke-load:  fork "):
        assert line in run.stdout
    assert Path(f"{dest}.manifest.json").is_file()
    assert Path(f"{dest}.preview.png").is_file()
    assert verify(str(dest)).sha256 in run.stdout
    check = h5forge("verify", str(dest), cwd=tmp_path, cache=tmp_path / "cache")
    assert check.returncode == 0, check.stderr


def test_build_runs_the_flow_on_a_folder(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "out" / "small.h5"
    run = h5forge("build", str(small_folder), str(dest), "--size", "32", "--smoke-workers", "0",
                  cwd=tmp_path, cache=tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "samples:     12 in 2 classes, 0 quarantined" in run.stdout
    assert verify(str(dest)).num_samples == 12


def test_build_failure_exits_1_with_one_paragraph_and_no_traceback(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    write_bad_files(small_folder / "cat")
    dest = tmp_path / "out" / "small.h5"
    run = h5forge("build", str(small_folder), str(dest), "--max-bad-fraction", "0",
                  "--smoke-workers", "0", cwd=tmp_path, cache=tmp_path / "cache")
    assert run.returncode == 1
    assert "error: build failed, nothing was published:" in run.stderr
    assert "max_bad_fraction" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert not dest.exists()


def test_a_usage_error_exits_2_without_traceback(tmp_path: Path) -> None:
    run = h5forge("build", "nope://bucket/x", "out.h5", cwd=tmp_path, cache=tmp_path / "cache")
    assert run.returncode == 2, run.stderr
    assert "error: invalid options: source:" in run.stderr
    assert "fsspec does not know" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "images", "out.h5", "--size", "-1"], "size: Input should be greater than"),
        (["build", "images", "out.hdf5"], "must end in .h5"),
        (["build", "images", "out.h5", "--sha256", "xyz"], "64 hexadecimal digits"),
        (["build", "images", "out.h5", "--layout", "blob"], "Invalid value for '--layout'"),
        (["build", "images"], "Missing argument"),
        (["demo", "out.hdf5"], "must end in .h5"),
    ],
)
def test_usage_errors_exit_2_before_any_work(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
