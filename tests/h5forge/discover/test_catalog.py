"""Tests for h5forge.discover.catalog: ImageFolder and listing discovery."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5forge.discover.catalog import IMAGE_EXTENSIONS, MAX_DEPTH, SPLIT_NAMES, Catalog, discover
from h5forge.discover.listing import LABEL_FLOOR
from h5forge.errors import EmptyDatasetError
from h5forge.files import remove_tree
from tests.fixtures.trees import deep_chain, touch_at

PNG = b"\x89PNG\r\n\x1a\n"  # contents do not matter to discovery


def _touch(path: Path, data: bytes = PNG) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _check_invariants(cat: Catalog) -> None:
    assert list(cat.classes) == sorted(cat.classes)
    keys = [
        ((SPLIT_NAMES.index(s.split) if s.split else -1), s.label, s.relpath) for s in cat.samples
    ]
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
        "cat/cat_0000.jpg",
        "cat/cat_0001.png",
        "cat/cat_0002.jpg",
        "cat/cat_0003.png",
        "cat/gray.png",
    ]
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
    assert [(s.split, s.label) for s in cat.samples] == [
        ("train", 0),
        ("train", 1),
        ("validation", 1),
    ]


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
    assert cat.skipped == {
        "broken-link-or-special-file": 1,
        "hidden": 3,
        "not-an-image-extension": 2,
        "outside-class-folder": 1,
    }
    assert ".git" not in cat.classes


def test_nested_folders_and_file_symlinks_are_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    real = _touch(root / "a" / "deep" / "er" / "x.jpg")
    (root / "b").mkdir()
    (root / "b" / "link.png").symlink_to(real)
    (root / "b" / "rel.png").symlink_to("../a/deep/er/x.jpg")
    cat = discover(root)
    assert [s.relpath for s in cat.samples] == ["a/deep/er/x.jpg", "b/link.png", "b/rel.png"]
    assert cat.samples[1].path == str(root / "b" / "link.png")


def test_links_out_of_the_root_are_skipped_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    secret = _touch(outside / "secret.png")
    root = tmp_path / "root"
    _touch(root / "a" / "x.png")
    (root / "a" / "leak.png").symlink_to(secret)  # a file link out
    (root / "a" / "chain.png").symlink_to("leak.png")  # a link to that link: still out
    (root / "a" / "dir").symlink_to(outside)  # a folder link out
    (root / "b").symlink_to(outside)  # a whole class folder out
    cat = discover(root)
    assert [s.relpath for s in cat.samples] == ["a/x.png"]
    assert cat.classes == ("a",)
    assert cat.skipped == {"link-outside-root": 4}
    (root / "c").mkdir()
    (root / "c" / "only.png").symlink_to(secret)
    with pytest.raises(EmptyDatasetError, match=r"'.*/c' holds no image.*1 link-outside-root"):
        discover(root)


def test_root_given_through_a_link_still_counts_as_inside(tmp_path: Path) -> None:
    real_root = tmp_path / "data"
    _touch(real_root / "a" / "x.png")
    (real_root / "a" / "same.png").symlink_to(real_root / "a" / "x.png")
    (tmp_path / "alias").symlink_to(real_root)
    cat = discover(tmp_path / "alias")
    assert [s.relpath for s in cat.samples] == ["a/same.png", "a/x.png"]


@pytest.mark.slow  # 1,200 folders: seconds on a busy disk
def test_a_1200_deep_local_tree_is_cut_at_the_depth_limit(tmp_path: Path) -> None:
    _touch(tmp_path / "a" / "top.png")
    deep_chain(
        tmp_path / "a",
        1_200,
        lambda level, fd: (
            touch_at(f"at{level}.png", fd) if level in (11, MAX_DEPTH - 1, MAX_DEPTH + 6) else None
        ),
    )
    try:
        cat = discover(tmp_path)
    finally:
        remove_tree(tmp_path / "a")  # shutil.rmtree (pytest's clean-up) recurses on 3.11
    assert [s.relpath.count("/") for s in cat.samples] == [12, MAX_DEPTH, 1]
    assert cat.skipped == {"folder-too-deep": 1}


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


def _listing_tree(tmp_path: Path) -> Path:
    for rel in ("imgs/1.jpg", "imgs/2.png", "imgs/sub/3.png", "other/4.png"):
        _touch(tmp_path / rel)
    return tmp_path


def test_csv_listing_with_names_and_splits(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    (root / "labels.csv").write_text(
        "\ufeffpath,label,split,extra\nimgs/2.png,dog,val,z\nimgs/1.jpg,cat,train,z\n"
        "./imgs/sub/3.png,dog,train,z\nother/4.png,cat,val,z\n",
        encoding="utf-8",
    )
    cat = discover(root, listing="labels.csv")
    assert cat.root == str(root)
    assert cat.classes == ("cat", "dog")
    assert cat.splits == ("train", "val")
    assert [(s.split, s.label, s.relpath) for s in cat.samples] == [
        ("train", 0, "imgs/1.jpg"),
        ("train", 1, "imgs/sub/3.png"),
        ("val", 0, "other/4.png"),
        ("val", 1, "imgs/2.png"),
    ]
    _check_invariants(cat)


def test_csv_listing_with_integer_labels(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    (root / "m.csv").write_text("path,label\nimgs/1.jpg,10\nimgs/2.png,2\n")
    cat = discover(root, listing=root / "m.csv")
    assert cat.classes == tuple(str(i) for i in range(11))
    assert [(s.relpath, s.label) for s in cat.samples] == [("imgs/2.png", 2), ("imgs/1.jpg", 10)]


def test_jsonl_listing(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    lines = [{"path": "imgs/1.jpg", "label": 1}, {"path": "imgs/2.png", "label": 0}]
    (root / "m.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    cat = discover(root, listing="m.jsonl")
    assert cat.classes == ("0", "1")
    assert cat.splits == ()
    assert [(s.relpath, s.label, s.split) for s in cat.samples] == [
        ("imgs/2.png", 0, ""),
        ("imgs/1.jpg", 1, ""),
    ]
    (root / "n.jsonl").write_text(
        json.dumps({"path": "other/4.png", "label": "ünï", "split": "test"}) + "\n"
    )
    named = discover(root, listing="n.jsonl")
    assert named.classes == ("ünï",)
    assert named.splits == ("test",)


@pytest.mark.parametrize(
    ("name", "text", "error", "match"),
    [
        (
            "m.csv",
            "path,label\nimgs/1.jpg,a\nimgs/missing.png,a\n",
            FileNotFoundError,
            r"m\.csv:3: file 'imgs/missing.png' not found",
        ),
        ("m.csv", "file,label\nimgs/1.jpg,a\n", ValueError, r"lacks \['path'\]"),
        ("m.csv", "path,label\n../escape.png,a\n", ValueError, r"m\.csv:2: .*stay inside"),
        ("m.csv", "path,label\n/etc/passwd,a\n", ValueError, r"m\.csv:2: .*relative"),
        (
            "m.csv",
            "path,label\nimgs/1.jpg,a\nimgs/1.jpg,b\n",
            ValueError,
            r"m\.csv:3: .*already listed on line 2",
        ),
        (
            "m.csv",
            "path,label,split\nimgs/1.jpg,a,holdout\n",
            ValueError,
            r"m\.csv:2: split 'holdout' is not one of",
        ),
        ("m.csv", "path,label\nimgs/1.jpg,\n", ValueError, r"m\.csv:2: empty label"),
        ("m.csv", "path,label\n", EmptyDatasetError, "lists no sample"),
        (
            "m.jsonl",
            '{"path": "imgs/1.jpg", "label": 0}\n{"path": "imgs/2.png", "label": "a"}\n',
            ValueError,
            "mixes integer and string labels",
        ),
        (
            "m.jsonl",
            '{"path": "imgs/1.jpg", "label": 0}\nnot json\n',
            ValueError,
            r"m\.jsonl:2: row is not JSON",
        ),
        ("m.jsonl", '{"path": "imgs/1.jpg", "label": -1}\n', ValueError, r"m\.jsonl:1: label -1"),
        ("m.jsonl", '{"label": 1}\n', ValueError, r"m\.jsonl:1: .*string 'path'"),
    ],
)
def test_listing_errors_name_the_line(
    tmp_path: Path, name: str, text: str, error: type[Exception], match: str
) -> None:
    root = _listing_tree(tmp_path)
    (root / name).write_text(text)
    with pytest.raises(error, match=match):
        discover(root, listing=name)


def test_missing_listing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="listing .* does not exist"):
        discover(tmp_path, listing="nope.csv")


def test_extensions_and_split_names() -> None:
    assert all(e.startswith(".") and e == e.lower() for e in IMAGE_EXTENSIONS)
    assert {".jpg", ".jpeg", ".png", ".webp"} <= IMAGE_EXTENSIONS
    assert SPLIT_NAMES == ("train", "val", "validation", "test")


_NAME = st.text(
    st.characters(codec="utf-8", categories=("L", "N", "Zs"), include_characters="-_"),
    min_size=1,
    max_size=10,
).filter(lambda s: s.strip() == s and s not in SPLIT_NAMES)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=st.dictionaries(
        _NAME,
        st.lists(st.tuples(_NAME, st.sampled_from([".png", ".JPG"])), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    )
)
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
        (c, f"{c}/{f}") for c, files in classes.items() for f in files
    }
    keys = [(s.label, s.relpath) for s in cat.samples]
    assert keys == sorted(keys)


# --------------------------------------------------------------------------- hostile listings


def _write(root: Path, name: str, data: str | bytes) -> str:
    (root / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return name


_BIG = "x" * (128 * 1024)


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        # Labels bounded by the rows, never allocated by value.
        (
            "m.csv",
            "path,label\nimgs/1.jpg,0\nimgs/2.png,1099511627776\n",
            r"m\.csv:3: label 1099511627776 is out of range: a listing of 2 rows may use integer "
            r"labels 0\.\.1,023",
        ),
        (
            "m.jsonl",
            '{"path": "imgs/1.jpg", "label": 1099511627776}\n',
            r"m\.jsonl:1: label 1099511627776 is out of range",
        ),
        (
            "m.csv",
            "path,label\nimgs/1.jpg,0\nimgs/2.png," + "9" * 1000 + "\n",
            r"m\.csv:3: label 9{20}\.\.\.\[\d+ characters omitted\]\.\.\.9+ is out of range",
        ),
        (
            "m.jsonl",
            '{"path": "imgs/1.jpg", "label": ' + "9" * 5000 + "}\n",
            r"m\.jsonl:1: row is not JSON \(ValueError",
        ),
        # Sizes.
        (
            "m.csv",
            f"path,label\nimgs/1.jpg,a\nimgs/2.png,{_BIG}\n",  # at the csv limit
            r"m\.csv:3: label is 131,072 characters, over the limit of 1,024",
        ),
        (
            "m.csv",
            f"path,label\nimgs/1.jpg,a\nimgs/2.png,{_BIG}y\n",  # over it
            r"m\.csv:3: a field is longer than 131,072 characters \(the CSV parser's limit\)",
        ),
        (
            "m.csv",
            f'path,label\nimgs/1.jpg,a\n"{_BIG}\n{_BIG}",b\n',  # over it at line 3's end
            r"m\.csv:3: a field is longer than 131,072 characters",
        ),
        (
            "m.csv",
            "path,label\nimgs/1.jpg," + "a" * 2000 + "\n",
            r"m\.csv:2: label is 2,000 characters, over the limit of 1,024",
        ),
        (
            "m.jsonl",
            '{"path": "' + "a" * (2 << 20) + '", "label": 0}\n',
            r"m\.jsonl:1: line is longer than 1,048,576 bytes",
        ),
        (
            "m.csv",
            "path,label\n" + "a/" * 2100 + "x.png,a\n",
            r"m\.csv:2: path 'a/a/.*' is 4,205 bytes, over the limit of 4,096",
        ),
        # Bytes that are not text.
        (
            "m.csv",
            b"path,label\nimgs/1.jpg,a\nimgs/2.png,b\x00c\n",
            r"m\.csv:3: NUL byte at column 13",
        ),
        (
            "m.jsonl",
            b'{"path": "imgs/1.jpg", "label": 0}\n{"path": "a\x00", "label": 0}\n',
            r"m\.jsonl:2: NUL byte at column 12",
        ),
        (
            "m.csv",
            b"path,label\nimgs/1.jpg,caf\xe9\n",
            r"m\.csv:2: byte 0xe9 at column 15 is not "
            r"UTF-8; save the listing as UTF-8",
        ),
        (
            "m.jsonl",
            b'{"path": "imgs/1.jpg", "label": 0}\n\xff\xfe{\n',
            r"m\.jsonl:2: byte 0xff at column 1 is not UTF-8",
        ),
        ("m.csv", "\ufeffpath,label\n".encode("utf-16"), r"m\.csv:1: NUL byte"),
        # Shapes.
        (
            "m.csv",
            "path,label\nimgs/1.jpg,a,extra\n",
            r"m\.csv:2: 3 fields, but the header has 2 \(path,label\); quote fields",
        ),
        ("m.csv", "path,label,split\nimgs/1.jpg,a\n", r"m\.csv:2: 2 fields, but the header has 3"),
        (
            "m.csv",
            "path,label,path\nimgs/1.jpg,a,b\n",
            r"m\.csv:1: header names \['path'\] more "
            "than once",
        ),
        ("m.csv", "path,label\n,a\n", r"m\.csv:2: empty path"),
        ("m.jsonl", '{"path": "", "label": 0}\n', r"m\.jsonl:1: empty path"),
        (
            "m.jsonl",
            "[" * 100_000 + "\n",
            r"m\.jsonl:1: row is not JSON h5forge reads: it nests more than 32 levels",
        ),
        ("m.jsonl", '{"path": "imgs/1.jpg", "label": 0.5}\n', r"m\.jsonl:1: label 0\.5 must be"),
        # A quoted field holding newlines: the count stays on physical lines.
        (
            "m.csv",
            'path,label\nimgs/1.jpg,"a\nb\nc"\n"x\ny",z,extra\n',
            r"m\.csv:5: 3 fields, but the header has 2",
        ),
        (
            "m.csv",
            'path,label\nimgs/1.jpg,"multi\nline\nlabel"\n\n\nimgs/missing.png,a\n',
            r"m\.csv:7: file 'imgs/missing.png' not found",
        ),
        # Names are shown escaped.
        (
            "m.csv",
            "path,label\nimgs/\x1b[2J\x1b]0;pwned\x07.png,a\n",
            r"m\.csv:2: file 'imgs/\\x1b\[2J\\x1b\]0;pwned\\x07\.png' not found",
        ),
        (
            "m.csv",
            "path,label,split\nimgs/1.jpg,a,\x1b[31mred\n",
            r"m\.csv:2: split '\\x1b\[31mred' is not one of",
        ),
    ],
)
def test_hostile_listing_errors_name_file_line_value_and_rule(
    tmp_path: Path, name: str, data: str | bytes, match: str
) -> None:
    root = _listing_tree(tmp_path)
    _write(root, name, data)
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        discover(root, listing=name)
    text = str(info.value)
    assert re.search(match, text), text
    assert str(root / name) in text
    assert text.isprintable()
    assert len(text) < 2_000


def test_integer_labels_up_to_the_row_bound_are_kept(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    _write(root, "m.csv", f"path,label\nimgs/1.jpg,{LABEL_FLOOR - 1}\nimgs/2.png,0\n")
    assert len(discover(root, listing="m.csv").classes) == LABEL_FLOOR
    _write(root, "m.csv", f"path,label\nimgs/1.jpg,{LABEL_FLOOR}\nimgs/2.png,0\n")
    with pytest.raises(ValueError, match=f"m.csv:2: label {LABEL_FLOOR} is out of range"):
        discover(root, listing="m.csv")


def test_many_rows_justify_many_classes(tmp_path: Path) -> None:
    rows = LABEL_FLOOR + 200
    (tmp_path / "imgs").mkdir()
    for i in range(rows):
        (tmp_path / "imgs" / f"{i}.png").touch()
    body = "".join(f"imgs/{i}.png,{rows - 1 - i}\n" for i in range(rows))
    _write(tmp_path, "m.csv", "path,label\n" + body)
    cat = discover(tmp_path, listing="m.csv")
    assert len(cat.classes) == rows
    _write(tmp_path, "m.csv", "path,label\n" + body.replace(f",{rows - 1}\n", f",{rows}\n"))
    with pytest.raises(
        ValueError, match=f"m.csv:2: label {rows} is out of range: a listing of {rows:,} rows"
    ):
        discover(tmp_path, listing="m.csv")


def _links_tree(tmp_path: Path) -> Path:
    root = _listing_tree(tmp_path / "set")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"not yours")
    (root / "out.png").symlink_to(secret)
    (root / "hop.png").symlink_to("out.png")  # a link to a link out
    (root / "updir").symlink_to(tmp_path)  # a folder link out
    (root / "in.png").symlink_to("imgs/1.jpg")
    (root / "loop.png").symlink_to("loop.png")
    os.mkfifo(root / "pipe.png")
    return root


@pytest.mark.timeout(20)  # a FIFO opened for reading would block forever
@pytest.mark.parametrize(
    ("rel", "match"),
    [
        (
            "out.png",
            r"path 'out\.png' is a symbolic link \(or passes through one\) to '.*/secret"
            r"\.png', outside the listing's folder",
        ),
        ("hop.png", r"path 'hop\.png' is a symbolic link .* to '.*/secret\.png', outside"),
        ("updir/secret.png", r"path 'updir/secret\.png' is a symbolic link .*outside"),
        ("/etc/passwd", r"path '/etc/passwd' must be relative to the listing's folder"),
        (
            "imgs/../../secret.png",
            r"path 'imgs/\.\./\.\./secret\.png' must be relative to the "
            r"listing's folder and stay inside",
        ),
        ("loop.png", r"path 'loop\.png' passes more than 40 symbolic links"),
        ("pipe.png", r"path 'pipe\.png' is a FIFO \(named pipe\), not a regular file"),
        ("imgs", r"path 'imgs' is a folder, not a regular file"),
    ],
)
def test_listing_paths_may_not_leave_the_folder_or_name_special_files(
    tmp_path: Path, rel: str, match: str
) -> None:
    root = _links_tree(tmp_path)
    _write(root, "m.csv", f"path,label\nimgs/1.jpg,a\n{rel},b\n")
    with pytest.raises(ValueError, match=r"m\.csv:3: " + match):
        discover(root, listing="m.csv")


def test_device_files_are_refused_without_opening_them(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    (root / "dev.png").symlink_to("/dev/zero")  # out of the folder: refused as such
    _write(root, "m.csv", "path,label\ndev.png,a\n")
    with pytest.raises(ValueError, match="outside the listing's folder"):
        discover(root, listing="m.csv")
    if os.geteuid() == 0:  # a device node inside the folder (mknod needs root)
        os.mknod(root / "null.png", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
        _write(root, "m.csv", "path,label\nnull.png,a\n")
        with pytest.raises(ValueError, match="'null.png' is a character device, not a regular"):
            discover(root, listing="m.csv")


def test_links_and_dotdot_that_stay_inside_are_allowed(tmp_path: Path) -> None:
    root = _links_tree(tmp_path)
    _write(root, "m.csv", "path,label\nin.png,a\nimgs/sub/../../other/4.png,b\n")
    cat = discover(root, listing="m.csv")
    assert [s.relpath for s in cat.samples] == ["in.png", "other/4.png"]
    assert cat.samples[0].path == str(root / "in.png")


@pytest.mark.timeout(20)
def test_a_fifo_as_the_listing_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "m.csv")
    with pytest.raises(
        ValueError,
        match=r"listing '.*m\.csv' is a FIFO \(named pipe\), not a "
        "regular file",
    ):
        discover(tmp_path, listing="m.csv")


def test_bom_and_crlf_listings(tmp_path: Path) -> None:
    root = _listing_tree(tmp_path)
    _write(root, "m.csv", b"\xef\xbb\xbfpath,label\r\nimgs/1.jpg,a\r\n\r\nimgs/2.png,b\r\n")
    assert [s.relpath for s in discover(root, listing="m.csv").samples] == [
        "imgs/1.jpg",
        "imgs/2.png",
    ]
    _write(root, "m.jsonl", b'\xef\xbb\xbf{"path": "imgs/1.jpg", "label": "a"}\r\n')
    assert discover(root, listing="m.jsonl").classes == ("a",)
    _write(root, "m.csv", b"\xef\xbb\xbfpath,label\r\nimgs/1.jpg,a\r\nimgs/missing.png,b\r\n")
    with pytest.raises(FileNotFoundError, match=r"m\.csv:3: file 'imgs/missing\.png'"):
        discover(root, listing="m.csv")


def test_extra_columns_become_targets_and_columns_empty_ignores_them(tmp_path: Path) -> None:
    """Before target columns a listing's extra columns were ignored; ``columns={}`` still does
    that, giving the catalog of the same listing without them."""
    root = _listing_tree(tmp_path)
    (root / "with.csv").write_text("path,label,split,extra\nimgs/2.png,dog,val,z\n")
    (root / "without.csv").write_text("path,label,split\nimgs/2.png,dog,val\n")
    plain = discover(root, listing="without.csv")
    assert (plain.schema, plain.rejected, plain.samples[0].targets) == ((), (), ())
    assert discover(root, listing="with.csv", columns={}) == plain
    extra = discover(root, listing="with.csv")
    assert [(c.name, c.kind) for c in extra.schema] == [("extra", "text")]
    assert extra.samples[0].targets == ("z",)
    assert extra.samples == tuple(dataclasses.replace(s, targets=("z",)) for s in plain.samples)


def test_an_image_folder_has_no_targets(image_folder: Path) -> None:
    cat = discover(image_folder)
    assert cat.schema == ()
    assert cat.rejected == ()
    assert {s.targets for s in cat.samples} == {()}
