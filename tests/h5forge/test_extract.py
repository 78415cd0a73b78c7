"""safe_extract: hostile archives are refused whole, good archives of every format extract."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from h5forge.errors import UnsafeArchiveError
from h5forge.extract import detect_archive, safe_extract
from tests.fixtures.archives import (
    ATTACKS,
    GOOD_FILES,
    GOOD_FORMATS,
    Attack,
    tar_bytes,
    write_good_archive,
)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_rejected_naming_member_and_nothing_written(tmp_path: Path, attack: Attack) -> None:
    work = tmp_path / "work"
    out = work / "out"
    out.mkdir(parents=True)
    archive = tmp_path / f"attack{attack.suffix}"
    attack.build(archive)
    before = _tree(tmp_path)

    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract(archive, out / "dest", **attack.caps)

    assert repr(attack.member) in str(info.value)
    assert _tree(tmp_path) == before  # no staging left, nothing escaped
    assert not Path("/tmp/h5forge-evil.txt").exists()


@pytest.mark.parametrize("suffix", list(GOOD_FORMATS))
def test_good_archive_extracts(tmp_path: Path, suffix: str) -> None:
    # A misleading name: the format must be detected from the content.
    archive = tmp_path / "download.bin"
    write_good_archive(archive, suffix)
    dest = tmp_path / "out" / "dest"

    assert safe_extract(archive, dest) == str(dest)

    for name, data in GOOD_FILES.items():
        assert (dest / name).read_bytes() == data
    latest = dest / "data" / "latest"
    assert latest.is_symlink()
    assert os.readlink(latest) == "cat"
    assert (latest / "a.jpg").read_bytes() == GOOD_FILES["data/cat/a.jpg"]
    if suffix != ".zip":
        copy = dest / "data" / "dog" / "copy.jpg"
        assert not copy.is_symlink()
        assert copy.read_bytes() == GOOD_FILES["data/cat/a.jpg"]
    assert os.listdir(tmp_path / "out") == ["dest"]


def test_later_member_replaces_symlink_without_writing_through_it(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        target = tarfile.TarInfo("target.txt")
        target.size = 8
        tf.addfile(target, io.BytesIO(b"original"))
        link = tarfile.TarInfo("f")
        link.type = tarfile.SYMTYPE
        link.linkname = "target.txt"
        tf.addfile(link)
        replacement = tarfile.TarInfo("f")
        replacement.size = 11
        tf.addfile(replacement, io.BytesIO(b"replacement"))

    dest = Path(safe_extract(archive, tmp_path / "dest"))

    assert (dest / "target.txt").read_bytes() == b"original"
    assert not (dest / "f").is_symlink()
    assert (dest / "f").read_bytes() == b"replacement"


def test_not_an_archive_and_bad_caps(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"<html>not found</html>")
    assert detect_archive(junk) is None
    with pytest.raises(ValueError, match="not a supported archive"):
        safe_extract(junk, tmp_path / "dest")
    good = tmp_path / "good.tar"
    good.write_bytes(tar_bytes({"x/y": b"1"}))
    with pytest.raises(ValueError, match="max_members=0"):
        safe_extract(good, tmp_path / "dest", max_members=0)
    assert _tree(tmp_path) == ["good.tar", "junk.tar.gz"]


def test_truncated_archive_names_member(tmp_path: Path) -> None:
    data = tar_bytes({"big.bin": os.urandom(200_000)}, "w:gz")
    archive = tmp_path / "cut.tgz"
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnsafeArchiveError, match="'big.bin'.*corrupt or truncated"):
        safe_extract(archive, tmp_path / "out" / "dest")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_existing_destination(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"new.txt": b"new"}))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.txt").write_text("old")

    with pytest.raises(FileExistsError, match="replace=True"):
        safe_extract(archive, dest)
    assert _tree(dest) == ["old.txt"]

    safe_extract(archive, dest, replace=True)
    assert _tree(dest) == ["new.txt"]
    assert sorted(os.listdir(tmp_path)) == ["a.tar", "dest"]

    (tmp_path / "empty").mkdir()
    safe_extract(archive, tmp_path / "empty")  # an empty folder counts as free
    assert _tree(tmp_path / "empty") == ["new.txt"]


def test_member_clashing_with_an_earlier_one(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        for name in ("a", "a/b"):  # a file, then a member that needs "a" to be a folder
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UnsafeArchiveError, match="'a/b' clashes with an earlier member"):
        safe_extract(archive, tmp_path / "dest")
    assert os.listdir(tmp_path) == ["a.tar"]
