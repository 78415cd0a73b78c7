"""Tests for h5forge.demo: deterministic synthetic images, folders, bad files, demo archive."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5forge.demo import (
    DEMO_ARCHIVE_NAME,
    make_demo_archive,
    synth_photo,
    write_bad_files,
    write_image_folder,
)
from h5forge.discover.catalog import discover
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Quarantined, process_file


def test_synth_photo_is_deterministic_and_photo_like() -> None:
    a = synth_photo(np.random.default_rng(42), 120, 160)
    b = synth_photo(np.random.default_rng(42), 120, 160)
    c = synth_photo(np.random.default_rng(43), 120, 160)
    assert a.mode == "RGB"
    assert a.size == (160, 120)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    pixels = np.asarray(a).astype(np.int16)
    assert pixels.std() > 15  # not a flat colour
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1000  # gradients, texture, noise
    neighbour = np.abs(np.diff(pixels, axis=1)).mean()
    assert 1 < neighbour < 20  # mostly smooth, with noise and a few edges
    for h, w in ((1, 1), (1, 2000), (2000, 1)):
        assert synth_photo(np.random.default_rng(0), h, w).size == (w, h)
    with pytest.raises(ValueError, match="at least 1 x 1"):
        synth_photo(np.random.default_rng(0), 0, 5)


def test_write_image_folder(tmp_path: Path) -> None:
    kwargs = {
        "classes": ("b", "a"),
        "per_class": 3,
        "splits": ("train", "test"),
        "seed": 9,
        "size": ((10, 20), (30, 40)),
        "formats": ("jpeg", "png", "webp"),
    }
    paths = write_image_folder(tmp_path / "one", **kwargs)  # type: ignore[arg-type]
    again = write_image_folder(tmp_path / "two", **kwargs)  # type: ignore[arg-type]
    assert paths == sorted(paths)
    assert len(paths) == 12
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    rel = [p.relative_to(tmp_path / "one").as_posix() for p in paths]
    assert "train/b/b_0002.webp" in rel
    assert "test/a/a_0000.jpg" in rel
    for p in paths:
        with Image.open(p) as img:
            assert 10 <= img.height <= 20
            assert 30 <= img.width <= 40
    fixed = write_image_folder(tmp_path / "fixed", classes=("x",), per_class=2, size=(7, 9))
    for p in fixed:
        with Image.open(p) as img:
            assert img.size == (9, 7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"classes": ()}, "non-empty sequence"),
        ({"classes": "abc"}, "non-empty sequence"),
        ({"classes": (".hidden",)}, "not start with '.'"),
        ({"per_class": 0}, "per_class=0"),
        ({"splits": ("holdout",)}, "splits=.*must be names from"),
        ({"formats": ("gif",)}, "formats=.*each must be one of"),
    ],
)
def test_write_image_folder_rejects_bad_arguments(
    tmp_path: Path, kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {"classes": ("a",), "per_class": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        write_image_folder(tmp_path, **args)  # type: ignore[arg-type]


def test_write_bad_files_lists_what_it_wrote(tmp_path: Path) -> None:
    kinds = write_bad_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kinds)
    assert len(set(kinds.values())) == len(kinds) == 14
    assert (tmp_path / "zero-byte.jpg").stat().st_size == 0
    assert (tmp_path / "bomb.png").stat().st_size < 200


@pytest.fixture(scope="module")
def demo_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_archive(tmp_path_factory.mktemp("demo"))


def test_demo_archive_is_reproducible(demo_archive: Path, tmp_path: Path) -> None:
    assert demo_archive.name == DEMO_ARCHIVE_NAME
    again = make_demo_archive(tmp_path / "new")
    assert (
        hashlib.sha256(again.read_bytes()).digest()
        == hashlib.sha256(demo_archive.read_bytes()).digest()
    )
    assert not list(tmp_path.joinpath("new").glob(".*"))  # no temporary left behind
    other = make_demo_archive(tmp_path / "seeded", seed=1)
    assert other.read_bytes() != demo_archive.read_bytes()


def test_demo_archive_contents(demo_archive: Path, tmp_path: Path) -> None:
    with tarfile.open(demo_archive) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        assert {m.mtime for m in members} == {1_700_000_000}
        assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
        tar.extractall(tmp_path, filter="data")
    cat = discover(tmp_path)
    assert cat.splits == ("train", "val")
    assert cat.classes == ("amber", "cobalt", "jade", "ruby")
    assert len(cat.samples) == 302
    results = [
        process_file(i, s.path, ImageConfig(size=(32, 32))) for i, s in enumerate(cat.samples)
    ]
    bad = {cat.samples[r.index].relpath: r.reason for r in results if isinstance(r, Quarantined)}
    assert sorted(bad) == ["train/amber/broken_zero.jpg", "val/cobalt/broken_truncated.png"]
    assert bad["train/amber/broken_zero.jpg"] == "zero-byte file"
    assert bad["val/cobalt/broken_truncated.png"].startswith("truncated image")
    for s in cat.samples[::25]:
        with Image.open(s.path) as img:
            assert 64 <= min(img.size) <= max(img.size) <= 160
