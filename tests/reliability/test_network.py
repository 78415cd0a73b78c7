"""Campaign 5, fast subset: HTTP fault sequences through fetch, an S3 outage during publish, and
the leftovers a killed fetch or publish leaves (removed by the next one)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge.fetch.sources import fetch
from h5forge.publish.sidecar import read_sidecar
from h5forge.publish.storage import publish
from tests.fixtures.servers import LoopbackHTTP
from tests.reliability import network
from tests.reliability._result import CampaignResult
from tests.reliability._servers import RestartableS3

pytestmark = pytest.mark.reliability


def test_http_faults_complete_or_fail_clearly(
    tmp_path: Path, http_server: LoopbackHTTP, other_http_server: LoopbackHTTP
) -> None:
    res = CampaignResult("network")
    archive, content = network.make_archive(tmp_path)
    rng = random.Random(3)
    for k in range(24):
        network.http_trial(k, http_server, archive, content, tmp_path, rng, res, other_http_server)
    assert res.ok, res.summary()
    assert res.outcomes["http: complete"] >= 12


def test_stalled_server_never_hangs(tmp_path: Path, http_server: LoopbackHTTP) -> None:
    archive, _ = network.make_archive(tmp_path)
    url = http_server.serve("/stall.tar.gz", archive)
    http_server.stall("/stall.tar.gz", seconds=60, times=10)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="stall.tar.gz"):
        fetch(
            url,
            tmp_path / "dest",
            retries=2,
            timeout=0.3,
            backoff=0.01,
            cache_dir=tmp_path / "cache",
        )
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "dest").exists()


@pytest.fixture
def restartable_s3(monkeypatch: pytest.MonkeyPatch) -> RestartableS3:
    for key, value in network._AWS.items():
        monkeypatch.setenv(key, value)
    s3 = RestartableS3()
    yield s3
    s3.close()


@pytest.mark.parametrize(
    "outage", [0.5, pytest.param(6.0, marks=pytest.mark.slow)], ids=["short-outage", "long-outage"]
)
def test_s3_outage_mid_upload_publishes_whole_or_nothing(
    tmp_path: Path, restartable_s3: RestartableS3, outage: float
) -> None:
    res = CampaignResult("network")
    local = tmp_path / "asset.h5"
    local.write_bytes(random.Random(1).randbytes(6 << 20))
    sha = hashlib.sha256(local.read_bytes()).hexdigest()
    network.s3_trial(
        0, restartable_s3, local, sha, random.Random(0), res, lambda s: None, when=(0.05, outage)
    )
    assert res.ok, res.summary()


def _killed_while_holding(code: str) -> None:
    """Run ``code`` in a child that SIGKILLs itself at the marker point."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_killed_fetch_leaves_nothing_that_blocks_or_lingers(tmp_path: Path) -> None:
    archive, content = network.make_archive(tmp_path)
    path = tmp_path / "data.tar.gz"
    path.write_bytes(archive)
    dest = tmp_path / "out" / "dest"
    # A fetch killed mid-extraction: it holds the lock and has a staging folder.
    _killed_while_holding(
        "import os, signal; from pathlib import Path; "
        "from h5forge.fetch.staging import exclusive, new_staging; "
        "from h5forge.files import make_marked_dir; "
        f"d = Path({str(dest)!r}); "
        "cm = exclusive(d); cm.__enter__(); s = new_staging(d); "
        "(s / 'half.jpg').write_bytes(b'x'); "
        # as fetch leaves it: the extraction's staging folder renamed, its marker kept
        "make_marked_dir(d.with_name(d.name + '.incoming-dead'), 'staging'); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    left = sorted(p.name for p in dest.parent.iterdir())
    assert left[:2] == ["dest.incoming-dead", "dest.lock"]
    assert len(left) == 3
    assert left[2].startswith("dest.staging-")
    t0 = time.perf_counter()
    result = fetch(path, dest, sha256=hashlib.sha256(archive).hexdigest())
    assert time.perf_counter() - t0 < 30  # the dead holder's lock did not block
    assert sorted(os.listdir(dest.parent)) == ["dest"]  # leftovers and lock gone
    assert len([p for p in Path(result.root).rglob("*") if p.is_file()]) == len(content)
    inode = os.stat(dest).st_ino
    fetch(path, dest, sha256=hashlib.sha256(archive).hexdigest())
    assert os.stat(dest).st_ino == inode  # the complete extraction is reused, not replaced


def test_killed_publish_temp_is_removed_by_the_next(tmp_path: Path) -> None:
    asset = tmp_path / "a.h5"
    asset.write_bytes(os.urandom(4096))
    dest = tmp_path / "pub" / "a.h5"
    dest.parent.mkdir()
    stale = dest.parent / ".a.h5.tmp-0123456789ab"
    stale.write_bytes(b"half a file")
    old = time.time() - 60
    os.utime(stale, (old, old))
    live = dest.parent / ".a.h5.tmp-live00000000"
    live.write_bytes(b"being written")
    os.utime(live, (old, old))
    import fcntl

    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a live writer holds its temp file
        publish(asset, str(dest))
        assert live.exists()
    assert not stale.exists()
    assert read_sidecar(str(dest))["bytes"] == 4096
