"""Campaign 8, fast subset: one build with a fresh PREFECT_HOME on busy cores, one kill + re-run."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability import first_run

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short scratch path (the build's TMPDIR holds AF_UNIX sockets, limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="h5first-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_fresh_prefect_home_on_busy_cores_then_kill_and_rerun(short_tmp: Path) -> None:
    # No prefect_harness here on purpose: each build starts Prefect's temporary server in a new
    # PREFECT_HOME, as a user's first run does, while every core is busy.
    res = first_run.run(busy=1, kills=1, seed=1, work=short_tmp, kill_window=20.0)
    assert res.ok, res.summary() + "\n" + "\n".join(res.notes)
    assert res.trials == 2
