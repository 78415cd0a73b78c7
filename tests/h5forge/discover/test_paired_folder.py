"""A paired images/masks folder as a source: pairing by stem, splits, links and left-outs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h5forge.discover.catalog import SPLIT_NAMES, UNLABELLED, discover
from h5forge.discover.report import describe
from h5forge.errors import EmptyDatasetError
from tests.fixtures.targets_data import write_mask, write_paired_folder


def test_pairs_round_trip_with_splits(tmp_path: Path) -> None:
    w = write_paired_folder(tmp_path, splits=("val", "train"), per_split=3)
    cat = discover(tmp_path, masks="masks")
    assert [(c.name, c.kind) for c in cat.schema] == [("mask", "mask")]
    assert cat.classes == (UNLABELLED,)
    assert cat.splits == ("train", "val")
    assert {s.relpath: s.targets for s in cat.samples} == {
        image: (str(tmp_path / mask),) for image, mask in w.pairs.items()
    }
    keys = [(SPLIT_NAMES.index(s.split), s.relpath) for s in cat.samples]
    assert keys == sorted(keys)
    assert {s.split for s in cat.samples} == {"train", "val"}
    for s in cat.samples:
        assert s.relpath.split("/")[1] == s.split
        assert Path(s.path) == tmp_path / s.relpath
    assert cat.rejected == ()
    assert cat.skipped == {}
    assert describe(cat) == "targets: mask (mask)"
    assert discover(tmp_path, masks="masks") == cat


def test_no_splits_and_a_custom_masks_folder(tmp_path: Path) -> None:
    w = write_paired_folder(tmp_path, splits=(), per_split=4, masks="labels")
    cat = discover(tmp_path, masks="labels")
    assert cat.splits == ()
    assert {s.split for s in cat.samples} == {""}
    assert sorted(s.relpath for s in cat.samples) == sorted(w.pairs)


def test_missing_and_extra_masks_and_the_png_preference(tmp_path: Path) -> None:
    w = write_paired_folder(tmp_path, splits=(), per_split=4)
    first, second = sorted(w.pairs)[:2]
    os.remove(tmp_path / w.pairs[first])
    write_mask(tmp_path / "masks" / "orphan.png", (4, 4), (0, 0, 1, 1), 1)
    stem = w.pairs[second][: -len(".png")]
    write_mask(tmp_path / f"{stem}.bmp", (4, 4), (0, 0, 1, 1), 1)  # a second mask, not .png
    (tmp_path / "masks" / "notes.txt").write_text("not an image")
    cat = discover(tmp_path, masks="masks")
    assert cat.rejected == ((first, f"no mask for {first}: expected {w.pairs[first]} (same stem)"),)
    assert first not in {s.relpath for s in cat.samples}
    by_rel = {s.relpath: s.targets for s in cat.samples}
    assert by_rel[second] == (str(tmp_path / w.pairs[second]),)
    assert cat.skipped == {
        "mask-duplicate-stem": 1,
        "mask-without-image": 1,
        "not-an-image-extension": 1,
    }
    assert describe(cat) == "targets: mask (mask); 1 quarantined"


def test_links_and_special_files_follow_the_image_folder_rules(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    w = write_paired_folder(root, splits=(), per_split=3)
    a, b, c = sorted(w.pairs)
    outside = write_mask(tmp_path / "outside.png", (4, 4), (0, 0, 1, 1), 1)
    os.remove(root / w.pairs[a])
    os.symlink(outside, root / w.pairs[a])  # a mask linked out of the root
    os.remove(root / w.pairs[b])
    os.mkfifo(root / w.pairs[b])  # refused without opening: discovery would hang otherwise
    inside = root / "masks" / "real.png"
    os.rename(root / w.pairs[c], inside)
    os.symlink(inside, root / w.pairs[c])  # a link inside the root is followed
    cat = discover(root, masks="masks")
    assert [s.relpath for s in cat.samples] == [c]
    assert [rel for rel, _ in cat.rejected] == [a, b]
    assert cat.skipped["link-outside-root"] == 1
    assert cat.skipped["broken-link-or-special-file"] == 1


@pytest.mark.parametrize(
    ("masks", "error", "match"),
    [
        ("../elsewhere", ValueError, "stay inside"),
        ("images", ValueError, "other than images/"),
        ("nomasks", FileNotFoundError, "no folder .*nomasks"),
    ],
)
def test_bad_masks_folders_are_refused(tmp_path: Path, masks: str, error, match) -> None:  # type: ignore[no-untyped-def]
    write_paired_folder(tmp_path, splits=(), per_split=1)
    with pytest.raises(error, match=match):
        discover(tmp_path, masks=masks)


def test_a_linked_masks_folder_outside_and_no_pairs(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_paired_folder(root, splits=(), per_split=2)
    os.rename(root / "masks", tmp_path / "masks")
    os.symlink(tmp_path / "masks", root / "masks")
    with pytest.raises(ValueError, match="outside the root"):
        discover(root, masks="masks")
    os.remove(root / "masks")
    (root / "masks").mkdir()
    with pytest.raises(EmptyDatasetError, match="no image has a mask; the first: no mask for"):
        discover(root, masks="masks")
