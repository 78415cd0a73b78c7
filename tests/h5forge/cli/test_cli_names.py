"""Names round-trip on the command line: an asset published as versions under ``DEST.h5`` is
verified and inspected by ``DEST.h5``, by its base ``DEST``, and by ``--version``, resolved as
``H5ImageDataset(url, version=...)`` resolves them; ``verify --json`` prints a document whatever
the outcome. Each command runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.writer import pack
from h5forge.publish.release import VersionResult, publish_version
from h5forge.read.dataset import H5ImageDataset
from h5forge.summary import summarize
from tests.fixtures.damage import flip_sample_byte


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5forge.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _json(*args: str) -> Any:
    run = _cli(*args, "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[VersionResult]]:
    """Two versions of ``store/flowers.h5`` (as ``build --versioned`` publishes them): no file
    of that name, ``store/flowers.latest.json`` naming the second."""
    tmp = tmp_path_factory.mktemp("names")
    dest = tmp / "store" / "flowers.h5"
    done = []
    for seed in (1, 2):
        root = tmp / f"src{seed}"
        write_image_folder(root, classes=("a", "b"), per_class=3, seed=seed, size=(20, 24))
        local = pack(root, tmp / f"v{seed}" / "flowers.h5", workers=1).path
        counts = summarize(Location(local))["counts"]  # what a build records in the sidecar
        done.append(publish_version(local, Location(str(dest)), extra={"counts": counts}))
    assert not dest.exists()
    return dest, done


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_the_name_it_was_built_to_and_its_base_read_the_latest(
    command: str, published: tuple[Path, list[VersionResult]]
) -> None:
    dest, (_, latest) = published
    base = str(dest)[: -len(".h5")]
    for name in (str(dest), base):
        got = _json(command, name)
        assert got["version"] == latest.sha256, name
        assert (got["path"] if command == "verify" else got["url"]) == latest.url
    # The same as the dataset's resolution, by either name.
    for name in (str(dest), base):
        ds = H5ImageDataset(name)
        assert (ds.url, ds.version) == (latest.url, latest.sha256)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_version_picks_one_by_prefix_or_latest(
    command: str, published: tuple[Path, list[VersionResult]]
) -> None:
    dest, (first, latest) = published
    base = str(dest)[: -len(".h5")]
    assert _json(command, base, "--version", first.version)["version"] == first.sha256
    assert _json(command, str(dest), "--version", first.sha256)["version"] == first.sha256
    assert _json(command, str(dest), "--version", "latest")["version"] == latest.sha256
    ds = H5ImageDataset(str(dest), version=first.version)
    assert (ds.url, ds.version) == (first.url, first.sha256)
    # Text output names the version it read.
    run = _cli(command, base, "--version", first.version)
    assert run.returncode == 0, run.stderr
    assert first.url in run.stdout or first.sha256 in run.stdout


def test_diff_resolves_names_and_versions_the_same_way(
    published: tuple[Path, list[VersionResult]],
) -> None:
    dest, (first, latest) = published
    base = str(dest)[: -len(".h5")]
    for refs in ([first.url, str(dest)], [base, first.version, "latest"]):
        got = _json("diff", *refs)
        assert (got["a"], got["b"]) == (first.url, latest.url), refs


def test_a_file_by_its_own_name_is_read_as_it_is(
    published: tuple[Path, list[VersionResult]],
) -> None:
    _, (first, _) = published
    got = _json("verify", first.url)
    assert (got["path"], got["version"]) == (first.url, "")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nothing.h5"], "no file at {d}/nothing.h5, and no published version of that asset"),
        (["flowers", "--version", "0" * 16], "no version 0000000000000000 of {d}/flowers"),
        (["flowers", "--version", "v1"], "version 'v1' must be 'latest' or the first 16-64"),
    ],
)
def test_a_name_or_version_that_is_not_there_is_a_usage_error(
    args: list[str], expected: str, published: tuple[Path, list[VersionResult]]
) -> None:
    folder = published[0].parent
    for command in ("verify", "inspect"):
        run = _cli(command, str(folder / args[0]), *args[1:])
        assert run.returncode == 2, (command, run.stderr)
        assert expected.format(d=folder) in run.stderr, (command, run.stderr)
        assert "Traceback" not in run.stderr


def test_verify_json_reports_a_failure_as_a_document(
    published: tuple[Path, list[VersionResult]], tmp_path: Path
) -> None:
    damaged = tmp_path / "damaged.h5"
    shutil.copyfile(published[1][0].url, damaged)
    flip_sample_byte(damaged, 2)
    run = _cli("verify", str(damaged), "--json", "--no-sidecar")
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is False
    assert report["path"] == str(damaged)
    assert report["error"] == f"{damaged} failed verification"
    [failure] = report["failures"]  # one per failed check: the one damaged sample
    assert failure.startswith("sample 2: sha256 of stored bytes is "), report
    assert run.stderr.startswith("error: ")  # the one line a person reads, as without --json
    good = _json("verify", published[1][0].url)
    assert (good["ok"], good["failures"]) == (True, [])


def test_verify_json_reports_a_sidecar_mismatch_as_a_document(
    published: tuple[Path, list[VersionResult]], tmp_path: Path
) -> None:
    _, (first, latest) = published
    run = _cli("verify", first.url, "--sidecar", latest.sidecar_url, "--json")
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is False
    assert any("sha256" in line for line in report["failures"]), report
