"""Property tests of discover's untrusted documents (issue 28): a COCO instances file (with and
without its masks) and a CSV or JSONL sample listing, read through :func:`discover`. Whatever
the file holds (any bytes, any JSON, a mutated real document, nesting past the bound, lines of
any JSON, a FIFO, a folder, a device), discover gives a catalog or its documented error: a
``ValueError`` naming the file (``EmptyDatasetError`` and ``TargetError`` are ones), or, for a
listing, ``FileNotFoundError`` for a listed file that does not exist; never another exception,
never a hang."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5forge.discover.catalog import discover
from h5forge.targets.schema import check_value
from tests.fixtures.documents import (
    FIFO,
    JSON_VALUES,
    TEXT,
    attempt,
    examples,
    mutated,
    place,
    placed_documents,
)
from tests.fixtures.targets_data import CocoWritten, write_coco_dataset


@pytest.fixture(scope="module")
def coco_template(tmp_path_factory: pytest.TempPathFactory) -> CocoWritten:
    return write_coco_dataset(tmp_path_factory.mktemp("coco-props"), images=3, unannotated=1)


def _with_rle(data: dict[str, Any]) -> dict[str, Any]:
    """The template with one annotation's segmentation as an uncompressed RLE too."""
    out = copy.deepcopy(data)
    image = out["images"][0]
    w, h = image["width"], image["height"]
    rle = dict(
        out["annotations"][0], id=999, segmentation={"size": [h, w], "counts": [3, w * h - 3]}
    )
    out["annotations"].append(rle)
    return out


@examples(100)
@given(data=st.data(), masks=st.booleans())
def test_a_coco_file_gives_a_catalog_or_a_value_error(
    coco_template: CocoWritten, data: st.DataObject, masks: bool
) -> None:
    content = data.draw(placed_documents(_with_rle(coco_template.data)), label="content")
    path = coco_template.root / "hostile.json"
    place(path, content)
    cat, error = attempt(
        lambda: discover(coco_template.root, coco="hostile.json", coco_masks=masks), ValueError
    )
    if error is not None:
        assert "hostile.json" in str(error)
        return
    boxes = cat.schema[0]
    for s in cat.samples:
        assert check_value(boxes, s.targets[0]) == s.targets[0]


_ROW = {"path": "img/0000.png", "label": "cat", "split": "train", "tags": ["a", "b"]}
_IMAGES = ["img/0000.png", "img/0001.jpg", "img/0002.png"]  # what coco_template wrote
_JSONL_LINES = (
    st.builds(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"), mutated(_ROW) | JSON_VALUES)
    | st.binary(max_size=40)
    | st.sampled_from([b"", b"   ", b"NaN", b"[" * 40 + b"]" * 40, b'{"path": "img/0001.jpg"}'])
)
_CSV_FIELDS = (
    TEXT
    | st.sampled_from(["path", "label", "split", "tags", *_IMAGES, "cat", '"', "1", "a,b"])
    | st.integers().map(str)
)
_CSV_ROWS = mutated(["img/0000.png", "cat", "train"]).map(
    lambda v: v if isinstance(v, list) else [v]
) | st.lists(_CSV_FIELDS, max_size=5)
_CSV_LINES = st.builds(
    lambda fields: ",".join(map(str, fields)).encode("utf-8", "surrogatepass"), _CSV_ROWS
) | st.binary(max_size=40)


@st.composite
def _listings(draw: st.DrawFn, suffix: str) -> bytes | str:
    """A valid listing of 1 to 3 of the images, with up to 2 hostile lines put anywhere (the
    CSV header included); one in ten times a FIFO instead."""
    if draw(st.integers(0, 9)) == 0:
        return FIFO  # opening it for reading would block: it must be refused unopened
    paths = draw(st.permutations(_IMAGES))[: draw(st.integers(1, 3))]
    rows = [
        (p, draw(st.sampled_from(["cat", "dog"])), draw(st.sampled_from(["train", "val"])))
        for p in paths
    ]
    if suffix == ".jsonl":
        lines = [
            json.dumps(dict(zip(("path", "label", "split"), r, strict=True))).encode() for r in rows
        ]
        hostile = _JSONL_LINES
    else:
        lines = [b"path,label,split", *(",".join(r).encode() for r in rows)]
        hostile = _CSV_LINES
    for _ in range(draw(st.integers(0, 2))):
        lines.insert(draw(st.integers(0, len(lines))), draw(hostile))
    end = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    return end.join(lines)


@examples(100)
@given(suffix=st.sampled_from([".jsonl", ".csv"]), data=st.data())
def test_a_sample_listing_gives_a_catalog_or_its_documented_error(
    coco_template: CocoWritten, suffix: str, data: st.DataObject
) -> None:
    name = f"listing{suffix}"
    place(coco_template.root / name, data.draw(_listings(suffix), label="listing"))
    cat, error = attempt(
        lambda: discover(coco_template.root, listing=name), ValueError, FileNotFoundError
    )
    if error is not None:
        assert name in str(error)
        return
    assert cat.samples
