"""Campaign 1, fast subset: SIGKILL a real `h5forge build` in two stages, check, re-run."""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from h5forge.demo import make_demo_archive
from h5forge.location import Location
from tests.reliability import crash

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

# Stage windows of a typical demo build (seconds); the kill lands at a random point inside.
_TYPICAL = crash.Baseline(
    total=6.0,
    begin=0.5,
    asset=Path("/nonexistent"),
    finished={
        "fetch": 0.9,
        "discover": 0.95,
        "pack": 2.6,
        "verify": 2.9,
        "smoke-load": 3.0,
        "preview": 3.2,
        "publish": 3.6,
        "report": 3.8,
    },
)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short scratch path: the build's TMPDIR holds multiprocessing's AF_UNIX sockets,
    whose paths may not exceed 107 bytes (pytest's tmp_path can)."""
    path = Path(tempfile.mkdtemp(prefix="h5rel-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("stage", ["preprocess", "publish"])
def test_killed_build_leaves_a_consistent_destination_and_reruns(
    prefect_harness: str, short_tmp: Path, stage: str
) -> None:
    src = make_demo_archive(short_tmp / "source")
    observed, state, problems, facts = crash.run_trial(
        0,
        stage,
        False,
        random.Random(stage),
        _TYPICAL,
        src,
        Location.of(src).sha256(),
        short_tmp,
        prefect_harness,
    )
    assert not problems, problems
    assert state in (
        "nothing published",
        "file without sidecar (not published)",
        "asset committed (sidecar matches)",
    ), state
    assert facts.get("tmp_bytes_after_rerun", 0) == 0  # the killed run's work dir was removed
