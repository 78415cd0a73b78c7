"""Real ``h5forge build --versioned`` processes on one local asset, in both layouts: sharded
(the default) and one file per version (``--max-shard-size off``).

* SIGKILL mid-pack of an incremental build: ``latest`` still names the complete previous
  version, nothing half-written counts as a version, and the same command run again completes
  and publishes the new one on top of it.
* Two builds at once (a nightly and a trigger): one publishes, the other refuses (the latest
  moved while it ran) or finds the source unchanged; nothing is torn.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.publish.history import list_versions, scan_versions
from h5forge.publish.manifest import read_manifest
from h5forge.publish.sidecar import read_sidecar
from h5forge.publish.versions import read_pointer
from h5forge.verify.checks import verify
from h5forge.verify.sharded import verify_version
from tests.reliability._procs import REPO, base_env, run_cli

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

LAYOUTS = ["sharded", "one file"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short scratch path (the build's TMPDIR holds AF_UNIX sockets of at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="h5ver-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _whole(dest: Path, pointer: Any) -> str:
    """The sha256 of the version ``pointer`` names after it verified in full (one file: and
    matched its sidecar; sharded: its manifest and every shard)."""
    if pointer.kind == "sharded":
        report = verify_version(Location(str(dest)), pointer.sha256)
        assert report.sha256 == pointer.sha256
        return str(report.sha256)
    sidecar = read_sidecar(pointer.url)
    checked = verify(pointer.url, sample_fraction=1.0)
    assert (checked.sha256, checked.bytes) == (sidecar["sha256"], sidecar["bytes"])
    assert Location.of(pointer.url).sha256() == sidecar["sha256"]
    return checked.sha256


def _changes(pointer: Any) -> tuple[dict[str, int], int]:
    """What the version ``pointer`` names records: its changes since its parent, its samples."""
    if pointer.kind == "sharded":
        manifest = read_manifest(Location(pointer.url), pointer.sha256)
        return json.loads(manifest.lineage["changes_json"]), manifest.num_samples
    sidecar = read_sidecar(pointer.url)
    return sidecar["changes"], sidecar["num_samples"]


def _args(src: Path, dest: Path, cache: Path, layout: str) -> list[str]:
    return [
        *("build", str(src), str(dest), "--versioned", "--min-age-s", "0"),
        *("--smoke-workers", "0", "--size", "32", "--workers", "1"),
        *("--cache-dir", str(cache)),
        *(("--max-shard-size", "off") if layout == "one file" else ()),
    ]


def _first_then_grown(
    tmp: Path, prefect_api: str, layout: str
) -> tuple[list[str], dict[str, str], Any, int]:
    """Build version 1 of a small source, then grow it by a class and 450 files to decode
    (the next pack takes seconds). Returns the build's arguments, its environment, the
    pointer to version 1 and the number of files added."""
    src = tmp / "src"
    write_image_folder(src, classes=("ant", "bee"), per_class=6, seed=1, size=(40, 40))
    args = _args(src, tmp / "pub" / "set.h5", tmp / "cache", layout)
    env = base_env(tmp / "run", prefect_api)
    first = run_cli(args, env, REPO)
    assert first.finish(timeout=240) == 0, first.text[-3000:]
    v1 = read_pointer(Location(str(tmp / "pub" / "set.h5")))
    assert v1 is not None
    more = write_image_folder(
        tmp / "more", classes=("ant", "bee", "cow"), per_class=150, seed=2, size=(320, 320)
    )
    for k, f in enumerate(more):
        (src / f.parent.name).mkdir(exist_ok=True)
        shutil.copy(f, src / f.parent.name / f"new{k}{f.suffix}")
    return args, env, v1, len(more)


def _no_leftovers(dest: Path) -> None:
    assert scan_versions(Location(str(dest))).skipped == 0  # no version folder without its sidecar
    leftovers = [p.name for p in dest.parent.rglob("*") if ".tmp-" in p.name or ".new-" in p.name]
    assert leftovers == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_killed_incremental_build_leaves_latest_whole_and_a_rerun_publishes(
    prefect_harness: str, short_tmp: Path, layout: str
) -> None:
    dest = short_tmp / "pub" / "set.h5"
    args, env, v1, added = _first_then_grown(short_tmp, prefect_harness, layout)
    killed = run_cli(args, env, REPO)
    partials = short_tmp / "run" / "tmp"
    deadline = time.monotonic() + 240
    while not list(partials.glob("h5forge-build-*/**/*.h5.partial")):
        assert killed.proc.poll() is None, killed.text[-3000:]
        assert time.monotonic() < deadline, "the pack never began"
        time.sleep(0.005)
    killed.kill()
    packed = "Task run 'pack[" if layout == "one file" else "Task run 'pack-shards["
    assert not any(packed in line for _, line in killed.lines), "killed after the pack"

    pointer = read_pointer(Location(str(dest)))
    assert pointer is not None
    assert pointer.sha256 == v1.sha256  # latest still names the whole previous version
    assert _whole(dest, pointer) == v1.sha256
    assert [v.sha256 for v in list_versions(Location(str(dest)))] == [v1.sha256]

    again = run_cli(args, env, REPO)
    assert again.finish(timeout=240) == 0, again.text[-3000:]
    v2 = read_pointer(Location(str(dest)))
    assert v2 is not None
    assert v2.sha256 != v1.sha256
    assert v2.parent == v1.sha256
    assert _whole(dest, v2) == v2.sha256
    assert _changes(v2) == ({"added": added, "removed": 0, "replaced": 0}, 12 + added)
    assert [v.sha256 for v in list_versions(Location(str(dest)))] == [v1.sha256, v2.sha256]
    _no_leftovers(dest)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_builds_at_once_one_publishes_and_nothing_is_torn(
    prefect_harness: str, short_tmp: Path, layout: str
) -> None:
    dest = short_tmp / "pub" / "set.h5"
    args, env, v1, added = _first_then_grown(short_tmp, prefect_harness, layout)
    runs = [run_cli(args, env, REPO) for _ in range(2)]
    codes = [w.finish(timeout=240) for w in runs]
    texts = [w.text for w in runs]
    assert sorted(codes) in ([0, 0], [0, 1]), texts
    latest = read_pointer(Location(str(dest)))
    assert latest is not None
    assert latest.parent == v1.sha256
    assert _whole(dest, latest) == latest.sha256
    assert _changes(latest)[0]["added"] == added
    # One published; the other was refused (based on version 1, it found latest moved) or,
    # begun after that publish, found its source and settings unchanged.
    assert [v.sha256 for v in list_versions(Location(str(dest)))] == [v1.sha256, latest.sha256]
    for code, text in zip(codes, texts, strict=True):
        assert "Traceback" not in text
        if code == 1:
            assert "moved to version" in text, text[-3000:]
            assert "run it again" in text
        else:
            assert f"version:     {latest.sha256[:16]}" in text, text[-3000:]
    _no_leftovers(dest)
