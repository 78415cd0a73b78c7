"""COCO instances JSON as a source: boxes round trip (xywh -> XYXY), hostile files and entries."""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5forge.discover.catalog import UNLABELLED, discover
from h5forge.discover.report import describe
from h5forge.errors import EmptyDatasetError
from h5forge.location import MAX_COCO_BYTES
from h5forge.targets.schema import MAX_BOXES, check_value
from tests.fixtures.targets_data import CocoWritten, write_coco_dataset


@pytest.fixture
def coco(tmp_path: Path) -> CocoWritten:
    return write_coco_dataset(tmp_path / "coco", images=5, unannotated=1)


def _want(w: CocoWritten, classes: tuple[str, ...]) -> dict[str, tuple]:
    return {
        name: (
            tuple(
                (x, y, x + bw, y + bh, float(classes.index(c)), float(crowd))
                for x, y, bw, bh, c, crowd in boxes
            ),
        )
        for name, boxes in w.boxes.items()
    }


def test_coco_boxes_round_trip_as_xyxy(coco: CocoWritten) -> None:
    cat = discover(coco.root, coco="annotations/instances.json")
    (column,) = cat.schema
    assert (column.name, column.kind) == ("boxes", "boxes")
    cats = coco.data["categories"]
    assert column.classes == tuple(sorted(c["name"] for c in cats))  # type: ignore[attr-defined]
    assert cat.classes == (UNLABELLED,)
    assert cat.root == str(coco.root)
    assert {s.relpath: s.targets for s in cat.samples} == _want(coco, column.classes)
    assert [s.relpath for s in cat.samples] == sorted(coco.boxes)
    assert cat.samples[-1].targets == ((),)  # the unannotated image: no boxes
    assert cat.rejected == ()
    assert cat.skipped == {}
    absolute = discover(coco.root, coco=coco.annotations)  # an absolute path works too
    assert absolute == cat
    assert describe(cat) == "targets: boxes (boxes, 3 classes)"


def _edit(w: CocoWritten, change) -> Path:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(w.data)
    change(data)
    return w.rewrite(data)


def _ann(data: dict, i: int) -> dict:  # type: ignore[type-arg]
    return data["annotations"][i]


@pytest.mark.parametrize(
    ("change", "image", "reason"),
    [
        (lambda d: _ann(d, 0)["bbox"].__setitem__(0, math.nan), 0, "not finite"),
        (lambda d: _ann(d, 3)["bbox"].__setitem__(2, -5.0), 1, "negative size"),
        (lambda d: _ann(d, 0)["bbox"].__setitem__(1, 10**400), 0, "too large for a float"),
        (lambda d: _ann(d, 1).__setitem__("category_id", 999), 0, "category_id 999, not one"),
        (lambda d: _ann(d, 0).__setitem__("bbox", [1, 2, 3]), 0, "is not [x, y, w, h]"),
        (lambda d: _ann(d, 0).__setitem__("bbox", "1,2,3,4"), 0, "is not [x, y, w, h]"),
        (lambda d: _ann(d, 0).__setitem__("iscrowd", 2), 0, "iscrowd 2, not 0/1"),
        (lambda d: d["images"][2].__setitem__("file_name", "img/gone.png"), 2, "missing image"),
    ],
)
def test_bad_entries_quarantine_their_image_only(coco: CocoWritten, change, image, reason) -> None:  # type: ignore[no-untyped-def]
    _edit(coco, change)
    cat = discover(coco.root, coco="annotations/instances.json")
    name = sorted(coco.boxes)[image] if "missing" not in reason else "img/gone.png"
    rejected = dict(cat.rejected)
    assert list(rejected) == [name]
    assert reason in rejected[name]
    if "missing" not in reason:
        assert rejected[name].startswith("bad target: ")
        assert f"instances.json': images[{image}])" in rejected[name]
    assert len(cat.samples) == 4
    assert name not in {s.relpath for s in cat.samples}


def test_annotations_of_unknown_images_are_counted(coco: CocoWritten) -> None:
    _edit(coco, lambda d: d["annotations"].append(dict(_ann(d, 0), image_id=12345)))
    cat = discover(coco.root, coco="annotations/instances.json")
    assert cat.skipped == {"annotation-unknown-image": 1}
    assert len(cat.samples) == 5


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x00\xff garbage", "is not JSON"),
        (b'{"images": [', "is not JSON"),
        (b"[1, 2, 3]", "is not COCO instances"),
        (b'{"images": {}, "categories": []}', "is not COCO instances"),
        (b'{"images": [], "categories": [], "annotations": 3}', "is not COCO instances"),
        (b'{"images": [{"id": "1", "file_name": "a"}], "categories": []}', r"images\[0\] is"),
        (b'{"images": [], "categories": [{"id": 1}]}', r"categories\[0\] is"),
        (
            b'{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}',
            "repeats id 1",
        ),
        (
            b'{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "a"}]}',
            "share a name",
        ),
        (b'{"images": [], "categories": [], "annotations": [7]}', r"annotations\[0\] is"),
        (b"[" * 100_000 + b"]" * 100_000, "is not JSON"),
    ],
)
def test_malformed_files_are_refused_naming_the_file(tmp_path: Path, data: bytes, match: str):
    (tmp_path / "c.json").write_bytes(data)
    with pytest.raises(ValueError, match=rf"c\.json.*{match}|{match}.*c\.json") as e:
        discover(tmp_path, coco="c.json")
    assert not isinstance(e.value, EmptyDatasetError)


def test_paths_and_sizes_are_bounded(coco: CocoWritten, tmp_path: Path) -> None:
    for bad, match in (("../outside.png", "stay inside"), ("/etc/passwd", "relative")):
        _edit(coco, lambda d, bad=bad: d["images"][0].__setitem__("file_name", bad))
        with pytest.raises(ValueError, match=rf"images\[0\]: path .*{match}"):
            discover(coco.root, coco="annotations/instances.json")
    (tmp_path / "elsewhere.png").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere.png", coco.root / "img" / "link.png")
    _edit(coco, lambda d: d["images"][0].__setitem__("file_name", "img/link.png"))
    with pytest.raises(ValueError, match="outside the images root"):
        discover(coco.root, coco="annotations/instances.json")
    os.mkfifo(coco.root / "img" / "fifo.png")
    _edit(coco, lambda d: d["images"][0].__setitem__("file_name", "img/fifo.png"))
    with pytest.raises(ValueError, match="FIFO"):
        discover(coco.root, coco="annotations/instances.json")
    _edit(coco, lambda d: d["images"][1].__setitem__("file_name", d["images"][0]["file_name"]))
    with pytest.raises(ValueError, match=r"images\[1\]: file .* is already images\[0\]"):
        discover(coco.root, coco="annotations/instances.json")
    big = coco.root / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_COCO_BYTES + 1)  # sparse: no gigabyte written
    with pytest.raises(ValueError, match=r"big\.json' is 1,073,741,825 bytes, over the limit"):
        discover(coco.root, coco="big.json")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        discover(coco.root, coco="nope.json")


def test_no_image_left_is_an_empty_dataset(tmp_path: Path) -> None:
    w = write_coco_dataset(tmp_path, images=2)
    w.rewrite(dict(w.data, images=[{"id": 1, "file_name": "img/none.png"}]))
    with pytest.raises(EmptyDatasetError, match="leaves no image.*missing image"):
        discover(tmp_path, coco=w.annotations.name and "annotations/instances.json")
    with pytest.raises(ValueError, match="give one source, not listing and coco"):
        discover(tmp_path, listing="m.csv", coco="annotations/instances.json")
    assert json.loads(w.annotations.read_text())["images"][0]["id"] == 1


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def coco_template(tmp_path_factory: pytest.TempPathFactory) -> CocoWritten:
    return write_coco_dataset(tmp_path_factory.mktemp("coco"), images=3, unannotated=1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.sampled_from(["images", "annotations", "categories"]),
    entry=st.integers(0, 5),
    key=st.sampled_from(["id", "file_name", "image_id", "category_id", "bbox", "iscrowd", "name"]),
    value=_JSON,
)
def test_any_field_value_gives_a_catalog_or_a_clear_error(
    coco_template: CocoWritten, section: str, entry: int, key: str, value: object
) -> None:
    """One field of one entry replaced by any JSON value: a catalog (its boxes checked) or a
    ValueError naming the file, never another exception."""
    data = copy.deepcopy(coco_template.data)
    entries = data[section]
    assert isinstance(entries, list)
    entries[entry % len(entries)][key] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "c.json")
        path.write_text(json.dumps(data))
        try:
            cat = discover(coco_template.root, coco=path)
        except ValueError as e:
            error: Exception | None = e
        else:
            error = None
    if error is not None:
        assert "c.json" in str(error), error
        return
    (column,) = cat.schema
    for s in cat.samples:
        assert check_value(column, s.targets[0]) == s.targets[0]
    assert len(cat.samples) + len(cat.rejected) == len(data["images"])  # type: ignore[arg-type]


def test_no_annotations_list_and_too_many_boxes(coco: CocoWritten) -> None:
    """An image-info file (no ``annotations``) lists every image without boxes; an image with
    more than MAX_BOXES boxes is quarantined, the others kept."""
    coco.rewrite({k: v for k, v in coco.data.items() if k != "annotations"})
    cat = discover(coco.root, coco="annotations/instances.json")
    assert {s.relpath: s.targets for s in cat.samples} == dict.fromkeys(coco.boxes, ((),))
    first = dict(coco.data["annotations"][0])  # type: ignore[index]
    many = [dict(first, id=k) for k in range(MAX_BOXES + 1)]
    coco.rewrite(dict(coco.data, annotations=many))
    cat = discover(coco.root, coco="annotations/instances.json")
    name = coco.data["images"][0]["file_name"]  # type: ignore[index]
    assert dict(cat.rejected)[name].startswith(f"bad target: column 'boxes': {MAX_BOXES + 1:,}")
    assert len(cat.samples) == len(coco.boxes) - 1
