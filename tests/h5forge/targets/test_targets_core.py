"""The target columns' core: schema rules, geometry against Pillow, stored bytes and back."""

from __future__ import annotations

import io
import math

import h5py
import numpy as np
import pytest
from PIL import Image

from h5forge.preprocess.normalise import TRANSPOSE, Plan
from h5forge.targets.columns import Columns
from h5forge.targets.geometry import Geometry, move_boxes, move_mask
from h5forge.targets.schema import (
    MAX_TEXT_BYTES,
    Column,
    TargetError,
    check_value,
    parse_schema,
    schema_json,
)
from h5forge.targets.store import TargetSink, decode_value, encode_targets

BOXES = Column("boxes", "boxes", classes=("cat", "dog"))


def _mask_with(rect: tuple[int, int, int, int], size: tuple[int, int]) -> Image.Image:
    arr = np.zeros(size[::-1], np.uint8)
    arr[rect[1] : rect[3], rect[0] : rect[2]] = 7
    return Image.fromarray(arr)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize(
    "plan", [None, Plan((80, 60), None), Plan((80, 60), (10, 4, 70, 50))], ids=str
)
def test_boxes_follow_the_mask_through_every_orientation_and_plan(orientation, plan):
    """A box and the mask of the same rectangle land on the same pixels: the transposition
    is Pillow's own (the image's), and an integer scale keeps NEAREST exact."""
    size, rect = (40, 30), (3, 5, 17, 12)
    file_size = size
    if plan is not None and orientation >= 5:  # the plan is of the transposed image
        plan = Plan((60, 80), None if plan.crop is None else (4, 10, 50, 70))
    g = Geometry(file_size, orientation, plan)
    mask = move_mask(_mask_with(rect, size), g)
    assert mask.shape == g.out_size[::-1]
    want = Image.fromarray(mask).getbbox()
    moved = move_boxes([(*rect, 1, 0)], g)
    assert moved.dropped == 0
    assert tuple(moved.boxes[0, :4]) == pytest.approx(want)
    assert tuple(moved.boxes[0, 4:]) == (1.0, 0.0)
    # and the mask's transposition is the image's: compare with Pillow directly
    if plan is None:
        direct = _mask_with(rect, size)
        if orientation != 1:
            direct = direct.transpose(TRANSPOSE[orientation])
        assert np.array_equal(np.asarray(direct), mask)


def test_boxes_are_clipped_and_empty_ones_dropped_and_counted():
    g = Geometry((100, 100), 1, Plan((100, 100), (20, 20, 80, 80)))
    moved = move_boxes([(0, 0, 50, 50, 0, 0), (0, 0, 10, 10, 1, 1), (70, 70, 200, 200, 1, 0)], g)
    assert moved.dropped == 1
    assert moved.boxes[:, :4].tolist() == [[0, 0, 30, 30], [50, 50, 60, 60]]
    assert moved.boxes.dtype == np.float32


def test_mask_of_another_size_is_refused():
    with pytest.raises(ValueError, match="mask of another size: 10 x 10, the image is 40 x 30"):
        move_mask(Image.new("L", (10, 10)), Geometry((40, 30)))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([(0, 0, math.nan, 5, 0, 0)], "not finite"),
        ([(5, 0, 1, 5, 0, 0)], "negative size"),
        ([(0, 0, 1, 1, 2, 0)], "class 2 is outside 0..1"),
        ([(0, 0, 1, 1, 0, 3)], "iscrowd is 3"),
        ([(0, 0, 1)], "expected \\(x1, y1, x2, y2, class, iscrowd\\)"),
        ("0 0 1 1", "expected a list of boxes"),
    ],
)
def test_bad_boxes_give_a_quarantine_reason(value, reason):
    with pytest.raises(TargetError, match=reason) as e:
        check_value(BOXES, value)
    assert str(e.value).startswith("bad target: column 'boxes'")


def test_text_and_number_bounds():
    text = Column("caption", "text")
    assert check_value(text, "a cat") == "a cat"
    with pytest.raises(TargetError, match="more than the limit"):
        check_value(text, "x" * (MAX_TEXT_BYTES + 1))
    with pytest.raises(TargetError, match="NUL"):
        check_value(text, "a\x00b")
    num = Column("score", "number", dtype="float64")
    with pytest.raises(TargetError, match="not a finite number"):
        check_value(num, float("inf"))
    with pytest.raises(TargetError, match="expected an integer"):
        check_value(Column("n", "number", dtype="int64"), 1.5)
    assert check_value(Column("tags", "multilabel", classes=("a", "b")), [1, 0, 1]) == (0, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "class", "kind": "text"}, "reserved"),
        ({"name": "Bad-Name", "kind": "text"}, "1..64 characters"),
        ({"name": "t", "kind": "text", "classes": ("a",)}, "only multilabel and boxes"),
        ({"name": "t", "kind": "multilabel", "classes": ("b", "a")}, "sorted"),
        ({"name": "n", "kind": "number"}, "needs dtype"),
        ({"name": "t", "kind": "video"}, "is not one of"),
    ],
)
def test_column_rules(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Column(**kwargs)


def test_schema_json_round_trip_and_hostile_json():
    schema = (BOXES, Column("mask", "mask", encoding="png"), Column("n", "number", dtype="int64"))
    assert parse_schema(schema_json(schema), where="f.h5") == schema
    for bad in ("{}", "[1]", '[{"name": "x"}]', '[{"name": "x", "kind": "text", "dtype": 3}]'):
        with pytest.raises(ValueError, match="f.h5: targets_json is not a valid target schema"):
            parse_schema(bad, where="f.h5")
    with pytest.raises(ValueError, match="repeat"):
        schema_json((BOXES, BOXES))


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_columns_written_and_read_back_with_ranges_and_digests(tmp_path, encoding):
    schema = (
        Column("tags", "multilabel", classes=("a", "b", "c")),
        BOXES,
        Column("mask", "mask", encoding=encoding),
        Column("caption", "text"),
        Column("score", "number", dtype="float64"),
    )
    rng = np.random.default_rng(0)
    masks = [rng.integers(0, 4, (30, 40), dtype=np.uint8) for _ in range(3)]
    files = {f"m{i}.png": _png(m) for i, m in enumerate(masks)}
    raws = [
        {
            "tags": (0, 2),
            "boxes": ((1, 2, 30, 20, 1, 0),),
            "mask": "m0.png",
            "caption": "één",
            "score": 0.5,
        },
        {"tags": (), "boxes": (), "mask": "m1.png", "caption": "", "score": -2.0},
        {
            "tags": (1,),
            "boxes": ((0, 0, 40, 30, 0, 1), (5, 5, 6, 6, 1, 0)),
            "mask": "m2.png",
            "caption": "x" * 1000,
            "score": 3.25,
        },
    ]
    sink = TargetSink(schema)
    for raw in raws:
        sink.add(
            encode_targets(
                schema, raw, Geometry((40, 30)), read=files.__getitem__, max_pixels=10_000
            )
        )
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as h5:
        sink.write(h5)
    with h5py.File(path, "r") as h5:
        cols = Columns(h5, schema)
        blob = path.read_bytes()
        for i, raw in enumerate(raws):
            assert cols.get("tags", i).tolist() == list(raw["tags"])
            assert cols.get("boxes", i).tolist() == [list(map(float, b)) for b in raw["boxes"]]
            assert np.array_equal(cols.get("mask", i), masks[i])
            assert cols.get("caption", i) == raw["caption"]
            assert cols.get("score", i) == raw["score"]
            for c in schema:  # one contiguous range per sample and column, digest-covered
                start, count = cols.ranges(c.name)[i]
                data = blob[start : start + count]
                assert data == cols.raw(c.name, i)
                import hashlib

                assert hashlib.sha256(data).digest() == bytes(h5[f"targets/{c.name}/digests"][i])
                shape = cols.shapes[c.name][i] if c.kind == "mask" else None
                decoded = decode_value(c, data, shape)
                assert np.array_equal(np.asarray(decoded), np.asarray(cols.get(c.name, i)))


def test_missing_or_bad_mask_is_a_target_error():
    schema = (Column("mask", "mask", encoding="raw"),)
    files = {
        "rgb.png": _png(np.zeros((30, 40, 3), np.uint8)),
        "junk.png": b"junk",
        "small.png": _png(np.zeros((3, 4), np.uint8)),
    }

    def read(p):
        return files[p] if p in files else open(p, "rb").read()

    for value, reason in [
        ("rgb.png", "not one channel"),
        ("junk.png", "does not decode"),
        ("small.png", "mask of another size"),
        ("/nope", "unreadable"),
    ]:
        with pytest.raises(TargetError, match=reason):
            encode_targets(
                schema, {"mask": value}, Geometry((40, 30)), read=read, max_pixels=10_000
            )
    with pytest.raises(TargetError, match="mask too large"):
        encode_targets(schema, {"mask": "small.png"}, Geometry((4, 3)), read=read, max_pixels=5)
