"""h5forge diff: what changed between two versions, from their indexes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from h5forge.asset.metadata import metadata_sha256
from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.diff import diff_files, resolve_pair
from h5forge.publish.release import VersionResult, publish_version
from h5forge.publish.versions import VERSION_FORM, parse_version, resolve_version
from h5forge.read.asset_list import parse_sources, read_asset_list
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.multi import H5MultiDataset
from h5forge.read.version import resolve_asset
from h5forge.verify.checks import verify

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


# --- one parser of version strings; verify and diff agree on what a valid file is ----------


def _non_canonical(key: str) -> list[object]:
    """Forms of ``key`` (a real 16-hex version key) and of ``latest`` that only look alike.
    (A key of digits alone is its own upper case: its upper-case form is one with a letter.)"""
    upper = key.upper() if key.upper() != key else "A" + key[1:]
    return [
        key + "\n",
        " " + key,
        upper,
        key + "0" * 49,  # 65 digits
        key[:15],
        "LATEST",
        "latest\n",
        "",
        16,
    ]


_ENTRIES = {  # every way a version string enters, in Python
    "parse_version": lambda base, bad: parse_version(bad),
    "resolve_version": lambda base, bad: resolve_version(Location(base), bad),
    "resolve_asset": lambda base, bad: resolve_asset(Location(base), bad),
    "reader": lambda base, bad: H5ImageDataset(base, version=bad),
    "diff": lambda base, bad: resolve_pair(Location(base), [bad, "latest"]),
    "diff, second": lambda base, bad: resolve_pair(Location(base), ["latest", bad]),
    "sources": lambda base, bad: parse_sources([{"url": base, "version": bad}]),
    "sources, pair": lambda base, bad: parse_sources([(base, bad)]),
    "multi": lambda base, bad: H5MultiDataset([{"url": base, "version": bad}]),
    "asset list": lambda base, bad: read_asset_list(Location(_asset_list(base, bad))),
}


def _asset_list(base: str, version: object) -> str:
    listed = Path(base).parent / "assets.json"
    assets = [{"url": base, "version": version}]
    listed.write_text(json.dumps({"format": "h5forge-shards", "version": 1, "assets": assets}))
    return str(listed)


@pytest.mark.parametrize("entry", sorted(_ENTRIES))
def test_every_entry_refuses_what_the_reader_refuses(
    two_versions: tuple[str, VersionResult, VersionResult], entry: str
) -> None:
    base, v1, _ = two_versions
    for bad in _non_canonical(v1.version):
        with pytest.raises(ValueError, match=re.escape(f"version {bad!r} must be {VERSION_FORM}")):
            _ENTRIES[entry](base, bad)
    assert _ENTRIES[entry](base, v1.version) is not None  # the canonical form is taken


@pytest.mark.parametrize(
    "command",
    [["diff", "{base}", "{bad}", "latest"], ["verify", "{base}", "--version", "{bad}"]]
    + [["inspect", "{base}", "--version", "{bad}"]],
)
def test_every_command_refuses_what_the_reader_refuses(
    two_versions: tuple[str, VersionResult, VersionResult], command: list[str]
) -> None:
    base, v1, _ = two_versions
    for bad in (v1.version.upper(), " " + v1.version, "LATEST", v1.version + "\t"):
        args = [a.format(base=base, bad=bad) for a in command]
        got = subprocess.run(
            [sys.executable, "-m", "h5forge.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert got.returncode == 2, (bad, got.stdout, got.stderr)
        assert VERSION_FORM in " ".join(got.stderr.split()), got.stderr


def _repeat_a_path(src: str, out: Path) -> Path:
    """A copy of ``src`` whose /paths[1] repeats /paths[0], resealed as an attacker would."""
    shutil.copyfile(src, out)
    with h5py.File(out, "r+") as h5:
        h5["paths"][1] = h5["paths"][0]
        h5.attrs["metadata_sha256"] = metadata_sha256(h5)
    return out


def test_verify_and_diff_both_refuse_a_repeated_sample_path(
    two_versions: tuple[str, VersionResult, VersionResult], tmp_path: Path
) -> None:
    _, v1, _ = two_versions
    twice = _repeat_a_path(v1.url, tmp_path / "twice.h5")
    with pytest.raises(IntegrityError, match=r"/paths\[1\] repeats the path of /paths\[0\]"):
        verify(str(twice))
    for a, b in ((v1.url, str(twice)), (str(twice), v1.url)):
        with pytest.raises(IntegrityError, match=r"sample path is not unique(.|\n)*/paths\[1\]"):
            diff_files(Location(a), Location(b))
    # the untouched file passes both
    verify(v1.url)
    assert diff_files(Location(v1.url), Location(v1.url)).same == 8
