"""h5forge diff: what changed between two versions, from their indexes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.diff import diff_files, resolve_pair
from h5forge.publish.release import VersionResult, publish_version

_CONFIG = PackConfig(ImageConfig(resize="resize", size=(16, 16)))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5forge.cli", "diff", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def two_versions(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, VersionResult, VersionResult]:
    """Version 1 of ant/bee; version 2 with one ant image removed, one bee image replaced by
    other bytes, and a new class cow of 2 images (so 2 added), packed the same way."""
    tmp = tmp_path_factory.mktemp("diff")
    src = tmp / "src"
    write_image_folder(src, classes=("ant", "bee"), per_class=4, seed=1)
    base = str(tmp / "pub" / "set")
    v1 = publish_version(pack(src, tmp / "1.h5", config=_CONFIG, workers=1).path, Location(base))
    ants, bees = sorted((src / "ant").iterdir()), sorted((src / "bee").iterdir())
    ants[0].unlink()
    other = tmp / "other"
    write_image_folder(other, classes=("x", "cow"), per_class=2, seed=9)
    shutil.copyfile(sorted((other / "x").iterdir())[0], bees[0])  # same name, other bytes
    shutil.copytree(other / "cow", src / "cow")
    v2 = publish_version(pack(src, tmp / "2.h5", config=_CONFIG, workers=1).path, Location(base))
    return base, v1, v2


def test_diff_counts_samples_classes_and_config(
    two_versions: tuple[str, VersionResult, VersionResult],
) -> None:
    base, v1, v2 = two_versions
    a, b = resolve_pair(Location(base), [v1.version, "latest"])
    d = diff_files(a, b)
    assert d.samples == (8, 9)
    assert (d.added, d.removed, d.replaced) == (2, 1, 1)
    assert d.same == 6
    assert d.classes_added == ("cow",)
    assert d.classes_removed == ()
    assert not d.config_changed
    assert diff_files(a, a).same == 8


def test_another_config_changes_every_stored_sample(
    two_versions: tuple[str, VersionResult, VersionResult], tmp_path: Path
) -> None:
    base, _, v2 = two_versions
    src = Path(base).parent.parent / "src"
    config = PackConfig(ImageConfig(resize="resize", size=(20, 20)))
    other = pack(src, tmp_path / "3.h5", config=config, workers=1).path
    d = diff_files(Location(v2.url), Location(other))
    assert d.config_changed
    assert (d.added, d.removed, d.replaced, d.same) == (0, 0, 9, 0)  # digests of stored bytes


def test_cli_diff_of_an_asset_and_two_versions(
    two_versions: tuple[str, VersionResult, VersionResult],
) -> None:
    base, v1, v2 = two_versions
    r = _cli(base, v1.version, v2.version)
    assert r.returncode == 0, r.stderr
    assert "samples: 8 -> 9 (2 added, 1 removed, 1 replaced, 6 unchanged)" in r.stdout
    assert "classes: +cow" in r.stdout
    assert "config: unchanged" in r.stdout
    as_json = _cli(f"{base}/v/{v1.version}/set.h5", f"{base}/v/{v2.version}/set.h5", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["added"] == 2


def test_cli_diff_refuses_a_bad_call(
    two_versions: tuple[str, VersionResult, VersionResult],
) -> None:
    base, v1, _ = two_versions
    assert _cli(base).returncode == 2
    missing = _cli(base, v1.version, "f" * 16)
    assert missing.returncode == 2
    assert "no version" in missing.stderr
