"""Tests for h5forge.catalog: ImageFolder and manifest discovery."""

from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5forge.catalog import IMAGE_EXTENSIONS, SPLIT_NAMES, Catalog, discover
from h5forge.errors import EmptyDatasetError

PNG = b"\x89PNG\r\n\x1a\n"  # contents do not matter to discovery


def _touch(path: Path, data: bytes = PNG) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _check_invariants(cat: Catalog) -> None:
    assert list(cat.classes) == sorted(cat.classes)
    keys = [((SPLIT_NAMES.index(s.split) if s.split else -1), s.label, s.relpath)
            for s in cat.samples]
    assert keys == sorted(keys)
    for s in cat.samples:
        assert os.path.isabs(s.path)
        assert os.path.isfile(s.path)
        assert "\\" not in s.relpath
        assert Path(cat.root, s.relpath) == Path(s.path)
        assert 0 <= s.label < len(cat.classes)


def test_image_folder(image_folder: Path) -> None:
    cat = discover(image_folder)
    assert cat.classes == ("cat", "dog", "owl")
    assert cat.splits == ()
    assert cat.root == str(image_folder)
    assert len(cat.samples) == 15
    assert cat.skipped == {}
    assert [s.relpath for s in cat.samples[:5]] == [
        "cat/cat_0000.jpg", "cat/cat_0001.png", "cat/cat_0002.jpg", "cat/cat_0003.png",
        "cat/gray.png"]
    assert {s.split for s in cat.samples} == {""}
    for s in cat.samples:
        assert s.relpath.split("/")[0] == cat.classes[s.label]
    assert cat.counts() == {"": {"cat": 5, "dog": 5, "owl": 5}}
    _check_invariants(cat)
    assert discover(image_folder) == cat  # deterministic


def test_splits_are_detected_and_ordered(split_folder: Path) -> None:
    cat = discover(split_folder)
    assert cat.splits == ("train", "val", "test")
    assert cat.classes == ("a", "b")
    assert [s.split for s in cat.samples] == ["train"] * 6 + ["val"] * 6 + ["test"] * 6
    assert cat.samples[0].relpath == "train/a/a_0000.jpg"
    assert cat.samples[6].relpath == "val/a/a_0000.jpg"
    assert cat.counts()["test"] == {"a": 3, "b": 3}
    _check_invariants(cat)


def test_split_missing_a_class_keeps_global_labels(tmp_path: Path) -> None:
    _touch(tmp_path / "train" / "x" / "1.png")
    _touch(tmp_path / "train" / "y" / "1.png")
    _touch(tmp_path / "validation" / "y" / "1.png")
    cat = discover(tmp_path)
    assert cat.splits == ("train", "validation")
    assert [(s.split, s.label) for s in cat.samples] == [("train", 0), ("train", 1),
                                                         ("validation", 1)]


def test_mixed_split_and_class_folders_is_an_error(tmp_path: Path) -> None:
    _touch(tmp_path / "train" / "cat" / "1.png")
    _touch(tmp_path / "dogs" / "1.png")
    with pytest.raises(ValueError, match=r"mixes split folders \['train'\].*\['dogs'\]"):
        discover(tmp_path)


def test_hidden_and_non_images_are_skipped_and_counted(image_folder: Path) -> None:
    _touch(image_folder / "cat" / ".hidden.jpg")
    _touch(image_folder / ".git" / "objects" / "x.png")
    _touch(image_folder / "dog" / ".cache" / "y.png")
    _touch(image_folder / "owl" / "notes.txt")
    _touch(image_folder / "owl" / "archive.tar.gz")
    _touch(image_folder / "README.md")
    (image_folder / "owl" / "gone.png").symlink_to(image_folder / "nowhere.png")
    _touch(image_folder / "owl" / "UPPER.JPEG")
    cat = discover(image_folder)
    assert len(cat.samples) == 16  # UPPER.JPEG counts: extensions are case-insensitive
    assert cat.skipped == {"broken-link-or-special-file": 1, "hidden": 3,
                           "not-an-image-extension": 2, "outside-class-folder": 1}
    assert ".git" not in cat.classes


def test_nested_folders_and_file_symlinks_are_followed(tmp_path: Path) -> None:
    real = _touch(tmp_path / "elsewhere" / "real.png")
    root = tmp_path / "root"
    _touch(root / "a" / "deep" / "er" / "x.jpg")
    (root / "b").mkdir()
    (root / "b" / "link.png").symlink_to(real)
    cat = discover(root)
    assert [s.relpath for s in cat.samples] == ["a/deep/er/x.jpg", "b/link.png"]
    assert cat.samples[1].path == str(root / "b" / "link.png")


@pytest.mark.timeout(20)
def test_symlink_loops_do_not_hang(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "sub" / "x.png")
    (tmp_path / "a" / "sub" / "up").symlink_to(tmp_path / "a")  # a/sub/up -> a: a cycle
    (tmp_path / "a" / "self").symlink_to(".")  # a/self -> a
    (tmp_path / "b").symlink_to(tmp_path / "a")  # another class aliasing a is fine
    cat = discover(tmp_path)
    assert [s.relpath for s in cat.samples] == ["a/sub/x.png", "b/sub/x.png"]
    assert cat.skipped == {"revisited-folder": 4}


def test_unicode_and_spaces_are_preserved(tmp_path: Path) -> None:
    name = "Ünïcødé 猫 photo.png"
    decomposed = unicodedata.normalize("NFD", "café")
    _touch(tmp_path / "chats à poil" / name)
    _touch(tmp_path / decomposed / "x y.jpg")
    cat = discover(tmp_path)
    assert cat.classes == tuple(sorted(("chats à poil", decomposed)))
    assert {s.relpath for s in cat.samples} == {f"chats à poil/{name}", f"{decomposed}/x y.jpg"}


def test_empty_dataset_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(EmptyDatasetError, match=str(tmp_path)):
        discover(tmp_path)
    _touch(tmp_path / "flat.jpg")
    with pytest.raises(EmptyDatasetError, match="no class folders"):
        discover(tmp_path)


def test_class_folder_without_images_names_it(image_folder: Path) -> None:
    _touch(image_folder / "zebra" / "notes.txt")
    _touch(image_folder / "zebra" / ".hidden.png")
    with pytest.raises(EmptyDatasetError, match=r"class folder '.*/zebra' holds no image"):
        discover(image_folder)


def test_empty_class_inside_a_split_names_it(split_folder: Path) -> None:
    (split_folder / "val" / "c").mkdir()
    with pytest.raises(EmptyDatasetError, match=r"val/c"):
        discover(split_folder)


def test_missing_or_file_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        discover(tmp_path / "nope")
    with pytest.raises(NotADirectoryError, match="not a folder"):
        discover(_touch(tmp_path / "x.png"))


def _manifest_tree(tmp_path: Path) -> Path:
    for rel in ("imgs/1.jpg", "imgs/2.png", "imgs/sub/3.png", "other/4.png"):
        _touch(tmp_path / rel)
    return tmp_path


def test_csv_manifest_with_names_and_splits(tmp_path: Path) -> None:
    root = _manifest_tree(tmp_path)
    (root / "labels.csv").write_text(
        "\ufeffpath,label,split,extra\nimgs/2.png,dog,val,z\nimgs/1.jpg,cat,train,z\n"
        "./imgs/sub/3.png,dog,train,z\nother/4.png,cat,val,z\n", encoding="utf-8")
    cat = discover(root, manifest="labels.csv")
    assert cat.root == str(root)
    assert cat.classes == ("cat", "dog")
    assert cat.splits == ("train", "val")
    assert [(s.split, s.label, s.relpath) for s in cat.samples] == [
        ("train", 0, "imgs/1.jpg"), ("train", 1, "imgs/sub/3.png"),
        ("val", 0, "other/4.png"), ("val", 1, "imgs/2.png")]
    _check_invariants(cat)


def test_csv_manifest_with_integer_labels(tmp_path: Path) -> None:
    root = _manifest_tree(tmp_path)
    (root / "m.csv").write_text("path,label\nimgs/1.jpg,10\nimgs/2.png,2\n")
    cat = discover(root, manifest=root / "m.csv")
    assert cat.classes == tuple(str(i) for i in range(11))
    assert [(s.relpath, s.label) for s in cat.samples] == [("imgs/2.png", 2), ("imgs/1.jpg", 10)]


def test_jsonl_manifest(tmp_path: Path) -> None:
    root = _manifest_tree(tmp_path)
    lines = [{"path": "imgs/1.jpg", "label": 1}, {"path": "imgs/2.png", "label": 0}]
    (root / "m.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    cat = discover(root, manifest="m.jsonl")
    assert cat.classes == ("0", "1")
    assert cat.splits == ()
    assert [(s.relpath, s.label, s.split) for s in cat.samples] == [("imgs/2.png", 0, ""),
                                                                    ("imgs/1.jpg", 1, "")]
    (root / "n.jsonl").write_text(json.dumps({"path": "other/4.png", "label": "ünï",
                                              "split": "test"}) + "\n")
    named = discover(root, manifest="n.jsonl")
    assert named.classes == ("ünï",)
    assert named.splits == ("test",)


@pytest.mark.parametrize(
    ("name", "text", "error", "match"),
    [
        ("m.csv", "path,label\nimgs/1.jpg,a\nimgs/missing.png,a\n", FileNotFoundError,
         r"m\.csv:3: file 'imgs/missing.png' not found"),
        ("m.csv", "file,label\nimgs/1.jpg,a\n", ValueError, r"lacks \['path'\]"),
        ("m.csv", "path,label\n../escape.png,a\n", ValueError, r"m\.csv:2: .*stay inside"),
        ("m.csv", "path,label\n/etc/passwd,a\n", ValueError, r"m\.csv:2: .*relative"),
        ("m.csv", "path,label\nimgs/1.jpg,a\nimgs/1.jpg,b\n", ValueError,
         r"m\.csv:3: .*already listed on line 2"),
        ("m.csv", "path,label,split\nimgs/1.jpg,a,holdout\n", ValueError,
         r"m\.csv:2: split 'holdout' is not one of"),
        ("m.csv", "path,label\nimgs/1.jpg,\n", ValueError, r"m\.csv:2: empty label"),
        ("m.csv", "path,label\n", EmptyDatasetError, "lists no sample"),
        ("m.jsonl", '{"path": "imgs/1.jpg", "label": 0}\n{"path": "imgs/2.png", "label": "a"}\n',
         ValueError, "mixes integer and string labels"),
        ("m.jsonl", '{"path": "imgs/1.jpg", "label": 0}\nnot json\n', ValueError,
         r"m\.jsonl:2: not JSON"),
        ("m.jsonl", '{"path": "imgs/1.jpg", "label": -1}\n', ValueError, r"m\.jsonl:1: label -1"),
        ("m.jsonl", '{"label": 1}\n', ValueError, r"m\.jsonl:1: .*string 'path'"),
    ],
)
def test_manifest_errors_name_the_line(tmp_path: Path, name: str, text: str,
                                       error: type[Exception], match: str) -> None:
    root = _manifest_tree(tmp_path)
    (root / name).write_text(text)
    with pytest.raises(error, match=match):
        discover(root, manifest=name)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="manifest .* does not exist"):
        discover(tmp_path, manifest="nope.csv")


def test_extensions_and_split_names() -> None:
    assert all(e.startswith(".") and e == e.lower() for e in IMAGE_EXTENSIONS)
    assert {".jpg", ".jpeg", ".png", ".webp"} <= IMAGE_EXTENSIONS
    assert SPLIT_NAMES == ("train", "val", "validation", "test")


_NAME = st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs"), include_characters="-_"),
                min_size=1, max_size=10).filter(lambda s: s.strip() == s and s not in SPLIT_NAMES)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=st.dictionaries(_NAME, st.lists(st.tuples(_NAME, st.sampled_from([".png", ".JPG"])),
                                            min_size=1, max_size=4), min_size=1, max_size=4))
def test_discover_property(tree: dict[str, list[tuple[str, str]]]) -> None:
    # Normalise and case-fold away names that one file system could merge into one.
    def key(s: str) -> str:
        return unicodedata.normalize("NFC", s).casefold()

    classes: dict[str, set[str]] = {}
    seen: set[str] = set()
    for cls, files in tree.items():
        if key(cls) in seen:
            continue
        seen.add(key(cls))
        classes[cls] = set({key(stem + ext): stem + ext for stem, ext in files}.values())
    with tempfile.TemporaryDirectory() as tmp:
        for cls, names in classes.items():
            for name in names:
                _touch(Path(tmp, cls, name))
        cat = discover(tmp)
    assert cat.classes == tuple(sorted(classes))
    assert len(cat.samples) == sum(len(f) for f in classes.values())
    assert {(cat.classes[s.label], s.relpath) for s in cat.samples} == {
        (c, f"{c}/{f}") for c, files in classes.items() for f in files}
    keys = [(s.label, s.relpath) for s in cat.samples]
    assert keys == sorted(keys)
