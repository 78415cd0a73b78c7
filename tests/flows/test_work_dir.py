"""The build's work folder in TMPDIR: only dead runs' marked folders are removed.

Dead and live runs are real processes holding (or having held) the folder's lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from h5forge.files import MARKER_NAME
from h5forge.workdir import work_dir

_REPO = Path(__file__).resolve().parents[2]

_RUN = """
import sys
from h5forge.workdir import work_dir
with work_dir() as work:
    (work / "x.h5.partial").write_bytes(b"packed bytes")
    print(work, flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _run(root: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {
        "TMPDIR": str(root),
        "PYTHONPATH": str(_REPO),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    with proc.stdout:
        return proc, Path(proc.stdout.readline().strip())


@pytest.mark.slow  # three processes import Prefect (~5 s each on 2 cores)
def test_only_dead_runs_marked_work_folders_are_removed(tmpdir_root: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    users = tmpdir_root / "h5forge-build-mine"  # the user's own, named like ours
    users.mkdir()
    (users / "notes.txt").write_bytes(b"keep me")
    faked = tmpdir_root / "h5forge-build-fake"  # a marker that is a link is no marker
    faked.mkdir()
    linked = tmpdir_root / "h5forge-build-link"  # a link to a folder is not our folder
    linked.symlink_to(users)
    live, live_dir = _run(tmpdir_root)
    dead, dead_dir = _run(tmpdir_root)
    (faked / MARKER_NAME).symlink_to(live_dir / MARKER_NAME)
    (dead_dir / "escape").symlink_to(victim)  # removing the dead folder must not follow it
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    assert dead.stdin is not None
    dead.stdin.close()
    try:
        assert dead_dir.is_dir()
        with work_dir() as work:
            assert work.is_dir()
            assert (work / MARKER_NAME).is_file()
            assert not dead_dir.exists()
            assert live_dir.is_dir()  # its run still holds the lock
            assert (users / "notes.txt").read_bytes() == b"keep me"
            assert faked.is_dir()
            assert linked.is_symlink()
        assert not work.exists()
        assert victim.read_bytes() == b"precious"
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(timeout=30)
    assert not live_dir.exists()


@pytest.mark.slow  # a process imports Prefect, then the CLI starts
def test_a_run_refused_before_it_packs_still_removes_a_dead_runs_folder(
    tmpdir_root: Path, tmp_path: Path
) -> None:
    """A build killed late leaves its work folder (the packed file, as large as the dataset);
    the same command run again is refused (its destination now exists) before it packs, and
    removes the folder all the same."""
    dead, dead_dir = _run(tmpdir_root)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    assert dead.stdin is not None
    dead.stdin.close()
    assert (dead_dir / "x.h5.partial").is_file()
    source, dest = tmp_path / "src", tmp_path / "out.h5"
    (source / "a").mkdir(parents=True)
    dest.write_bytes(b"published before")
    refused = subprocess.run(
        [sys.executable, "-m", "h5forge.cli", "pack", str(source), str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmpdir_root)},
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "already exists" in refused.stderr
    assert not dead_dir.exists()
    assert dest.read_bytes() == b"published before"
