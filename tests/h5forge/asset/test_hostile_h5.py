"""Opening any ``.h5`` is safe: crafted files (tests/fixtures/hostile_h5.py) through the real
entry points — H5ImageDataset (local, loopback HTTP, moto S3), ``verify``, ``summarize`` /
``render_preview``, ``merge_parts``, and ``h5forge verify|inspect`` as subprocesses."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import h5py
import pytest

from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.preprocess.images import decode_stored
from h5forge.publish.preview import render_preview
from h5forge.read.dataset import H5ImageDataset
from h5forge.scale.merge import merge_parts
from h5forge.summary import summarize
from h5forge.verify.checks import verify
from tests.fixtures.hostile_h5 import KINDS, SECRET, Kind, craft, make_aux
from tests.fixtures.servers import LoopbackHTTP

REPO = Path(__file__).resolve().parents[3]
BY_NAME = {k.name: k for k in KINDS}


@pytest.fixture
def aux(tmp_path: Path) -> Iterator[Path]:
    """The secret files and a FIFO; fails the test if anything opened the FIFO and hung.

    A watchdog opens the FIFO's write end after 20 s: that unblocks a reader stuck opening it
    (it then reads EOF), so a regression fails here instead of hanging the suite.
    """
    folder = make_aux(tmp_path / "aux")
    done, fired = threading.Event(), threading.Event()

    def watchdog() -> None:
        if done.wait(20):
            return
        try:
            fd = os.open(folder / "fifo", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody has it open for reading
            return
        fired.set()
        os.close(fd)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    yield folder
    done.set()
    thread.join()
    assert not fired.is_set(), "an entry point opened the FIFO and blocked on it"


def _crafted(kind: Kind, bases: dict[str, Path], tmp_path: Path, aux: Path) -> Path:
    return craft(kind, bases[kind.base], tmp_path / f"{kind.name}.h5", aux)


def _no_secret(*values: Any) -> None:
    for v in values:
        assert SECRET.decode() not in repr(v)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_kind_is_refused_or_harmless(
    kind: Kind, bases: dict[str, Path], tmp_path: Path, aux: Path
) -> None:
    path = str(_crafted(kind, bases, tmp_path, aux))
    calls = {
        "reader": lambda: H5ImageDataset(path)[0],
        "verify": lambda: verify(path),
        "inspect": lambda: (summarize(Location(path)), render_preview(Location(path), n=2, tile=8)),
    }
    for entry, call in calls.items():
        if entry in kind.refused_by:
            with pytest.raises(IntegrityError, match=kind.match):
                call()
        else:  # harmless to this entry point: it works and returns nothing from outside
            _no_secret(call())


@pytest.mark.parametrize(
    "name",
    [
        "ext-link-classes",
        "ext-storage-classes",
        "vds-labels",
        "soft-link-classes",
        "label-2-40",
        "shapes-huge",
        "index-beyond-file",
        "range-overlap",
    ],
)
def test_http_reader_refuses_before_reading(
    name: str, bases: dict[str, Path], tmp_path: Path, aux: Path, http_server: LoopbackHTTP
) -> None:
    kind = BY_NAME[name]
    data = _crafted(kind, bases, tmp_path, aux).read_bytes()
    url = http_server.serve("/asset.h5", data)
    with pytest.raises(IntegrityError, match=kind.match):
        H5ImageDataset(url)
    # The refusal came from the file's head: the open reads no sample bytes.
    ranges = [r.range for r in http_server.requests_for("/asset.h5") if r.range]
    assert len(ranges) <= 2, ranges


@pytest.mark.parametrize("name", ["ext-link-http", "vds-fifo", "label-negative"])
def test_s3_reader_refuses(
    name: str,
    bases: dict[str, Path],
    tmp_path: Path,
    aux: Path,
    s3_storage_options: dict[str, Any],
    s3_bucket: str,
) -> None:
    kind = BY_NAME[name]
    path = _crafted(kind, bases, tmp_path, aux)
    url = f"s3://{s3_bucket}/hostile.h5"
    with fsspec.open(url, "wb", **s3_storage_options) as f:
        f.write(path.read_bytes())
    with pytest.raises(IntegrityError, match=kind.match):
        H5ImageDataset(url, storage_options=s3_storage_options)
    with pytest.raises(IntegrityError, match=kind.match):
        verify(url, storage_options=s3_storage_options)


def test_a_well_formed_file_still_reads_over_http(
    bases: dict[str, Path], http_server: LoopbackHTTP
) -> None:
    url = http_server.serve("/good.h5", bases["encoded"].read_bytes())
    remote, local = H5ImageDataset(url), H5ImageDataset(bases["encoded"])
    assert len(remote) == len(local) == 9
    assert all(bool((remote[i][0] == local[i][0]).all()) for i in range(len(local)))


def test_fifo_as_the_asset_is_refused_without_blocking(aux: Path) -> None:
    fifo = str(aux / "fifo")
    for call in (
        lambda: H5ImageDataset(fifo),
        lambda: verify(fifo),
        lambda: summarize(Location(fifo)),
    ):
        with pytest.raises(IntegrityError, match="not a regular file"):
            call()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5forge.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


@pytest.mark.parametrize("name", ["ext-link-classes", "label-minus-100", "shapes-huge"])
def test_cli_verify_and_inspect_refuse_with_exit_1(
    name: str, bases: dict[str, Path], tmp_path: Path, aux: Path
) -> None:
    kind = BY_NAME[name]
    path = _crafted(kind, bases, tmp_path, aux)
    for command in ("verify", "inspect"):
        r = _cli(command, str(path))
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert SECRET.decode() not in r.stdout + r.stderr
        assert re.search(kind.match, r.stderr), r.stderr


def test_cli_inspect_shows_a_config_nested_too_deep_instead_of_a_traceback(
    bases: dict[str, Path], tmp_path: Path, aux: Path
) -> None:
    path = _crafted(BY_NAME["config-json-deep"], bases, tmp_path, aux)
    r = _cli("inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "config_json attribute is not JSON h5forge reads: it nests more than 32" in r.stdout
    assert len(r.stdout) < 10_000  # the attribute itself is not printed


@pytest.mark.parametrize("name", ["ext-link-nested", "label-negative", "labels-float"])
def test_merge_refuses_a_hostile_part(
    name: str, bases: dict[str, Path], tmp_path: Path, aux: Path
) -> None:
    kind = BY_NAME[name]
    good = tmp_path / "good.h5"
    shutil.copyfile(bases["decoded"], good)
    bad = _crafted(kind, bases, tmp_path, aux)
    out = tmp_path / "merged.h5"
    with pytest.raises(IntegrityError, match=kind.match):
        merge_parts([good, bad], out)
    assert not out.exists()
    assert not Path(str(out) + ".partial").exists()


# --------------------------------------------------------------------------- decode limits


def test_max_pixels_is_the_callers_limit_not_the_files(bases: dict[str, Path]) -> None:
    path = bases["encoded"]  # 16 x 20 = 320 pixels per sample, honestly recorded
    assert len(H5ImageDataset(path, max_pixels=320)) == 9
    with pytest.raises(
        IntegrityError,
        match=r"/shapes\[0\] = \(16, 20, 3\): 320 pixels, more "
        r"than max_pixels=319",
    ):
        H5ImageDataset(path, max_pixels=319)
    with pytest.raises(IntegrityError, match="more than max_pixels=100"):
        verify(str(path), max_pixels=100)
    with pytest.raises(ValueError, match="max_pixels=0 must be an int >= 1"):
        H5ImageDataset(path, max_pixels=0)
    with pytest.raises(ValueError, match="max_pixels=0 must be an int >= 1"):
        verify(str(path), max_pixels=0)
    ds = H5ImageDataset(path, max_pixels=320)
    assert pickle.loads(pickle.dumps(ds)).options.max_pixels == 320


def test_decode_stored_never_raises_its_limit_from_the_recorded_shape(
    bases: dict[str, Path],
) -> None:
    with h5py.File(bases["encoded"]) as h5:
        lo, hi = (int(x) for x in h5["offsets"][0:2])
        data = h5["images"][lo:hi].tobytes()
    assert decode_stored(data, (16, 20, 3), layout="encoded", mode="RGB").shape == (16, 20, 3)
    # A file claiming a bigger image no longer buys a bigger decode.
    with pytest.raises(
        IntegrityError,
        match=r"100000 x 100000 = 10000000000 pixels, more than "
        r"max_pixels=89478485",
    ):
        decode_stored(data, (100_000, 100_000, 3), layout="encoded", mode="RGB")
    # Without a recorded shape the image's own header is checked against the caller's limit.
    with pytest.raises(
        IntegrityError,
        match=r"too large to decode: image too large: 20 x 16 = "
        r"320 pixels > limit 300 \(max_pixels=300\)",
    ):
        decode_stored(data, None, layout="encoded", mode="RGB", max_pixels=300)


def test_huge_declared_images_are_refused_before_allocation(
    bases: dict[str, Path], tmp_path: Path, aux: Path
) -> None:
    path = _crafted(BY_NAME["images-huge-filtered"], bases, tmp_path, aux)
    with h5py.File(path) as h5:  # a 2.7 GB chunk declared in a file of a few KB
        assert h5["images"].chunks == (1, 30_000, 30_000, 3)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(
        IntegrityError,
        match=r"/images holds compressed samples of 30000 x "
        r"30000 = 900000000 pixels, more than "
        r"max_pixels=89478485",
    ):
        H5ImageDataset(path)
    assert len(H5ImageDataset(path, max_pixels=900_000_000)) == 9  # the caller may allow it


def test_fifo_under_a_files_name_is_never_opened_blocking_by_any_reader(aux: Path) -> None:
    """Issue 28, class 3: every reader that opens a local file by name again after the first
    check (ranges, the sample hash, the file hash, a part's hash in a merge) opens it without
    blocking and refuses it; none waits for a writer that never comes."""
    from h5forge.asset.ranges import RangeReader
    from h5forge.scale.file_check import Expected, FileChecks
    from h5forge.verify.digests import hash_local_ranges

    fifo = str(aux / "fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        RangeReader(Location(fifo))
    for mapped in (False, True):
        with pytest.raises(ValueError, match="not a regular file"):
            hash_local_ranges(fifo, [(0, 0, 10)], lambda *_: None, lambda _: None, mapped=mapped)
    with FileChecks(threads=1) as checks:
        checks.start(0, fifo, Expected(fifo, fifo + ".sidecar", "0" * 64, 0))
        with pytest.raises(ValueError, match="not a regular file"):
            checks.settle(0)
