"""The command line on sharded versions: verify, versions and diff (issue 29, item 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.location import Location
from h5forge.pack.writer import pack
from h5forge.publish.manifest import shard_key
from h5forge.publish.release import publish_version
from tests.fixtures.sharded import CONFIG, make_sharded_version


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5forge.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def asset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """``store/photos``: a single-file version, then two sharded ones (the latest of 3 shards,
    one row deleted); returns the base and the three versions' sha256."""
    tmp = tmp_path_factory.mktemp("cli-sharded")
    write_image_folder(tmp / "photos", classes=("ant", "bee"), per_class=6, seed=5)
    catalog = discover(tmp / "photos")
    base = tmp / "store" / "photos"
    single = pack(catalog.root, tmp / "all.h5", config=CONFIG, workers=1)
    first = publish_version(single.path, Location(str(base))).sha256
    slices = [(0, 4), (4, 8), (8, 12)]
    work = tmp / "work"
    second = make_sharded_version(base, catalog, slices, parent=first, work=work)
    third = make_sharded_version(base, catalog, slices, parent=second, deleted={1: [2]}, work=work)
    return base, [first, second, third]


def _json(*args: str) -> Any:
    run = _cli(*args, "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_verify_a_sharded_version_by_name_or_version(asset: tuple[Path, list[str]]) -> None:
    base, (_, second, third) = asset
    run = _cli("verify", str(base) + ".h5")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"OK {base}/v/{third[:16]}/photos.version.json: 11 samples")
    assert "3 shards" in run.stdout
    assert f"version {third}" in run.stdout
    report = _json("verify", str(base), "--version", second[:16])
    assert report["ok"]
    assert report["version"] == second
    assert report["num_samples"] == 12
    assert report["checked_samples"] == 12
    assert [s["live"] for s in report["shards"]] == [4, 4, 4]
    run = _cli("verify", str(base), "--sidecar", str(base / "x.json"))
    assert run.returncode == 2
    assert "a sharded version has no sidecar" in run.stderr


def test_versions_lists_both_kinds(asset: tuple[Path, list[str]]) -> None:
    base, shas = asset
    listed = _json("versions", str(base))["versions"]
    assert [(v["sha256"], v["kind"], v["shards"]) for v in listed] == [
        (shas[0], "file", None),
        (shas[1], "sharded", 3),
        (shas[2], "sharded", 3),
    ]
    lines = _cli("versions", str(base)).stdout.splitlines()
    assert lines[2].startswith(shas[2][:16])
    assert "in 3 shards  11 samples  latest  parent " + shas[1][:16] in lines[2]


def test_diff_between_a_file_and_a_sharded_version(asset: tuple[Path, list[str]]) -> None:
    base, (first, _, third) = asset
    d = _json("diff", str(base), first[:16], "latest")
    assert d["samples"] == [12, 11]
    assert (d["added"], d["removed"], d["replaced"], d["same"]) == (0, 1, 0, 11)


def test_verify_a_damaged_shard_exits_1_naming_it(
    asset: tuple[Path, list[str]], tmp_path: Path
) -> None:
    base, (_, _, third) = asset
    manifest = json.loads((base / "v" / third[:16] / "photos.version.json").read_text())
    gone = manifest["shards"][2]["sha256"]
    shard = base / shard_key(gone)
    moved = tmp_path / "moved.h5"
    shard.rename(moved)
    try:
        run = _cli("verify", str(base), "--json")
        assert run.returncode == 1
        document = json.loads(run.stdout)
        assert not document["ok"]
        assert document["failures"] == [f"shard 2 ({gone[:16]}): missing: {shard} is not there "
                                        "(deleted, or never uploaded)"]  # fmt: skip
        assert "1 of 3 shards failed" in run.stderr
    finally:
        moved.rename(shard)


def test_inspect_counts_a_sharded_versions_live_samples(asset: tuple[Path, list[str]]) -> None:
    base, (_, _, third) = asset
    catalog = discover(base.parent.parent / "photos")
    found = _json("inspect", str(base))
    assert found["version"] == third
    assert found["shards"] == 3
    counted: dict[str, int] = {}
    for per_class in found["counts"].values():
        for name, n in per_class.items():
            counted[name] = counted.get(name, 0) + n
    want: dict[str, int] = {}
    for i, s in enumerate(catalog.samples):
        if i != 4 + 2:  # shard 1 (samples 4-7), row 2: deleted in the latest version
            want[catalog.classes[s.label]] = want.get(catalog.classes[s.label], 0) + 1
    assert counted == want
    assert found["attributes"]["num_samples"] == 11
