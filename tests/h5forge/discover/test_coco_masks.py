"""COCO segmentations drawn as a mask column (``coco_masks``): polygons and RLE against
pycocotools (the reference implementation of COCO's masks), the paint rule, hostile shapes."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pycocotools.mask as coco_mask
import pytest

from h5forge.discover.catalog import discover
from h5forge.discover.coco_masks import CROWD, MAX_MASK_CLASSES, drawn
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset
from h5forge.targets.drawn import decode_rle, draw
from h5forge.targets.schema import Column, TargetError, check_value
from h5forge.targets.shapes import MAX_DRAWN_PIXELS, MAX_POINTS, Drawn, Shape
from tests.fixtures.targets_data import CocoWritten, write_coco_dataset

ANN = "annotations/instances.json"
AS_STORED = PackConfig(image=ImageConfig(resize="none"))  # the mask as drawn, no geometry


def _runs(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts of a (H, W) 0/1 mask: column-major runs from 0."""
    flat = mask.T.reshape(-1)
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    counts = np.diff(bounds).tolist()
    return counts if flat[0] == 0 else [0, *counts]


def _blob(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    mask = np.zeros((h, w), np.uint8)
    x, y = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
    mask[y : y + int(rng.integers(2, h // 2)), x : x + int(rng.integers(2, w // 2))] = 1
    mask[rng.random((h, w)) < 0.05] ^= 1  # holes and specks: many runs
    return mask


@pytest.mark.parametrize("seed", range(6))
def test_compressed_rle_decodes_as_pycocotools_encodes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(1, 80)), int(rng.integers(1, 80))
    mask = _blob(rng, max(h, 4), max(w, 4)) if seed else np.ones((h, w), np.uint8)
    h, w = mask.shape
    encoded = coco_mask.encode(np.asfortranarray(mask))
    counts = decode_rle(encoded["counts"])
    assert counts.tolist() == _runs(mask)
    shape = Shape(7, "rle", encoded["counts"], ())
    got = np.asarray(draw(Drawn((w, h), (shape,)), 1 << 20))
    assert np.array_equal(got, mask * 7)


def _polygons(polygons: list[list[float]], h: int, w: int) -> np.ndarray:
    """pycocotools' rasterisation of ``polygons``. Its decode trips numpy 2's ``__array__``
    deprecation (pycocotools 2.0.11), harmless here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.asarray(coco_mask.decode(coco_mask.merge(coco_mask.frPyObjects(polygons, h, w))))


def _with_masks(
    w: CocoWritten,
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The fixture's annotations with crowd ones as uncompressed RLE and every third
    non-crowd one as a compressed RLE string, and the mask pycocotools draws of each image
    by the documented rule (1 + class index, crowd 255, in file order), and the pixels near a
    polygon."""
    data = copy.deepcopy(w.data)
    classes = sorted(c["name"] for c in data["categories"])
    name_of = {c["id"]: c["name"] for c in data["categories"]}
    images = {im["id"]: im for im in data["images"]}
    want = {
        im["file_name"]: np.zeros((im["height"], im["width"]), np.uint8) for im in images.values()
    }
    near = {name: np.zeros(m.shape, bool) for name, m in want.items()}
    rng = np.random.default_rng(1)
    for k, a in enumerate(data["annotations"]):
        im = images[a["image_id"]]
        h, w_ = im["height"], im["width"]
        if a["iscrowd"]:
            m = _blob(rng, h, w_)
            a["segmentation"] = {"size": [h, w_], "counts": _runs(m)}
        elif k % 3 == 0:
            m = _blob(rng, h, w_)
            a["segmentation"] = {
                "size": [h, w_],
                "counts": coco_mask.encode(np.asfortranarray(m))["counts"].decode(),
            }
        else:
            m = _polygons(a["segmentation"], h, w_)
            near[im["file_name"]] |= _box_of(a["segmentation"], m.shape)
        value = CROWD if a["iscrowd"] else 1 + classes.index(name_of[a["category_id"]])
        want[im["file_name"]][m.astype(bool)] = value
    return data, want, near


def _box_of(polygons: list[list[float]], shape: tuple[int, ...]) -> np.ndarray:
    """The pixels of the polygons' bounding box, one pixel wider each side: where two
    rasterisers may disagree (a sliver one fills and the other leaves empty, say)."""
    xy = np.asarray([v for p in polygons for v in p], float).reshape(-1, 2)
    x1, y1 = np.floor(xy.min(axis=0)).astype(int) - 1
    x2, y2 = np.ceil(xy.max(axis=0)).astype(int) + 2
    out = np.zeros(shape, bool)
    out[max(y1, 0) : max(y2, 0), max(x1, 0) : max(x2, 0)] = True
    return out


def _perimeter(data: dict[str, Any], file_name: str) -> float:
    (image_id,) = [im["id"] for im in data["images"] if im["file_name"] == file_name]
    total = 0.0
    for a in data["annotations"]:
        if a["image_id"] == image_id and isinstance(a["segmentation"], list):
            for p in a["segmentation"]:
                xy = np.asarray(p, float).reshape(-1, 2)
                total += float(
                    np.linalg.norm(np.diff(np.vstack([xy, xy[:1]]), axis=0), axis=1).sum()
                )
    return total


def test_masks_round_trip_through_pack_and_reader(tmp_path: Path) -> None:
    w = write_coco_dataset(tmp_path / "coco", images=6, boxes_per_image=4, unannotated=1)
    data, want, near = _with_masks(w)
    w.rewrite(data)
    cat = discover(w.root, coco=ANN, coco_masks=True)
    assert [(c.name, c.kind) for c in cat.schema] == [("boxes", "boxes"), ("segmentation", "mask")]
    result = pack(w.root, tmp_path / "out.h5", coco=ANN, coco_masks=True, config=AS_STORED)
    assert result.num_samples == 6
    assert not result.quarantined
    ds = H5ImageDataset(result.path, target=["boxes", "segmentation"])
    rle_only = 0
    for i, path in enumerate(_paths(result.path)):
        image, target = ds[i]
        got = target["segmentation"].numpy()
        assert got.shape == image.shape[1:] == want[path].shape
        wrong = int((got != want[path]).sum())
        # Polygons are filled by Pillow, pycocotools rasterises its own way: they may differ
        # on the edge pixels only. RLE-only images are exact.
        perimeter = _perimeter(data, path)
        assert wrong <= perimeter, (path, wrong, perimeter)
        rle_only += perimeter == 0
        away = ~near[path]  # RLE, and background, away from any polygon: exact
        assert np.array_equal(got[away], want[path][away])
    assert rle_only >= 1  # the unannotated image at least: all background, exactly
    stats = result.target_stats["segmentation"]
    assert stats["images"]["0"] == 6
    assert CROWD in {int(k) for k in stats["pixels"]}


def test_masks_follow_the_image_through_resize_and_crop(tmp_path: Path) -> None:
    w = write_coco_dataset(tmp_path / "coco", images=3, boxes_per_image=2, unannotated=0)
    data, want, near = _with_masks(w)
    w.rewrite(data)
    sized = PackConfig(image=ImageConfig(resize="shorter-side", size=(32, 32)))
    result = pack(w.root, tmp_path / "out.h5", coco=ANN, coco_masks=True, config=sized)
    ds = H5ImageDataset(result.path, target="segmentation")
    for i, path in enumerate(_paths(result.path)):
        image, mask = ds[i]
        assert tuple(mask.shape) == tuple(image.shape[1:]) == (32, 32)
        # nearest-neighbour: every stored value is one the drawn mask holds
        assert set(np.unique(mask.numpy())) <= set(np.unique(want[path])) | {0}


def _paths(asset: Path) -> list[str]:
    with h5py.File(asset, "r") as f:
        return [p.decode() if isinstance(p, bytes) else str(p) for p in f["paths"][()]]


def _edited(w: CocoWritten, change) -> CocoWritten:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(w.data)
    change(data)
    w.rewrite(data)
    return w


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda a, im: a.update(segmentation=[[1, 2, 3]]), "not a list of polygons"),
        (lambda a, im: a.update(segmentation=[[1, 2, 3, 4, 5, 6, 7]]), "not a list of polygons"),
        (lambda a, im: a.update(segmentation=[[1, 2, float("nan"), 4, 5, 6]]), "NaN"),
        (lambda a, im: a.update(segmentation=[[1, 2, 1e39, 4, 5, 6]]), "beyond"),  # float32 inf
        (lambda a, im: a.update(segmentation=[[10**309, 2, 3, 4, 5, 6]]), "beyond"),  # no float
        (
            lambda a, im: a.update(
                segmentation={"size": [im["height"], im["width"]], "counts": "0" * (1 << 22)}
            ),
            "at most",
        ),
        (
            lambda a, im: (
                im.update(width=100_000, height=100_000),
                a.update(segmentation={"size": [100_000, 100_000], "counts": [5_000_000_000]}),
            ),
            "over the drawing limit",
        ),
        (lambda a, im: a.update(segmentation=[["1", 2, 3, 4, 5, 6]]), "not a list of polygons"),
        (lambda a, im: a.update(segmentation={"size": [1, 1], "counts": [1]}), "image's size"),
        (
            lambda a, im: a.update(
                segmentation={"size": [im["height"], im["width"]], "counts": [-1]}
            ),
            "neither COCO's string",
        ),
        (lambda a, im: a.update(segmentation="polygon"), "neither polygons nor an RLE"),
        (lambda a, im: im.pop("width"), "no integer width and height"),
    ],
)
def test_hostile_segmentations_quarantine_the_image(tmp_path: Path, change, reason: str) -> None:  # type: ignore[no-untyped-def]
    w = write_coco_dataset(tmp_path / "coco", images=3, unannotated=0)

    def edit(data: dict[str, Any]) -> None:
        a = data["annotations"][0]
        (im,) = [im for im in data["images"] if im["id"] == a["image_id"]]
        change(a, im)

    _edited(w, edit)
    cat = discover(w.root, coco=ANN, coco_masks=True)
    ((path, why),) = cat.rejected
    assert reason in why, why
    assert "segmentation" in why
    assert len(cat.samples) == 2
    assert discover(w.root, coco=ANN).rejected == ()  # without masks the image is fine


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ("0", "runs cover"),  # one run of 0 pixels
        ("a\x7f", "outside COCO's alphabet"),
        ("a", "ends inside a count"),  # 'a' = 49 | continuation bit: the count never ends
        ("o" * 8 + "0", "over 40 bits"),
    ],
)
def test_a_bad_rle_string_is_a_quarantine_reason_when_drawn(counts: str, reason: str) -> None:
    shape = Shape(1, "rle", counts.encode("latin-1"), ())
    with pytest.raises(TargetError, match=reason):
        draw(Drawn((3, 2), (shape,)), 1 << 20)


def test_a_mask_whose_size_is_not_the_image_s_is_quarantined_by_the_pack(tmp_path: Path) -> None:
    w = write_coco_dataset(tmp_path / "coco", images=3, unannotated=0)

    def wider(data: dict[str, Any]) -> None:
        im = data["images"][1]
        im["width"] += 1
        # an RLE whose runs do not cover the declared size: had it been drawn before its
        # size was compared with the file, the reason would be the runs, not the size
        (a, *_) = [a for a in data["annotations"] if a["image_id"] == im["id"]]
        a["segmentation"] = {"size": [im["height"], im["width"]], "counts": [1, 2]}

    _edited(w, wider)
    result = pack(w.root, tmp_path / "out.h5", coco=ANN, coco_masks=True, max_bad_fraction=0.5)
    ((path, why),) = result.quarantined
    assert path == w.data["images"][1]["file_name"]
    assert "mask of another size" in why


def test_bounds_on_points_pixels_and_classes(tmp_path: Path) -> None:
    tiny = np.zeros(6, np.float32).tobytes()
    dense = np.zeros(2 * (MAX_POINTS + 1), np.float32).tobytes()
    with pytest.raises(TargetError, match="polygon points"):
        drawn((10, 10), [Shape(1, "polygon", dense, (MAX_POINTS + 1,))], "w")
    whole = np.asarray([0, 0, 2000, 0, 2000, 2000], np.float32).tobytes()
    shapes = [Shape(1, "polygon", whole, (3,))] * (MAX_DRAWN_PIXELS // (2001 * 2001) + 1)
    with pytest.raises(TargetError, match="would cost"):
        drawn((2000, 2000), shapes, "w")
    # Pillow fills row by row, visiting every edge on each row: a zigzag of few pixels but
    # many points across all the rows costs rows x points, and is refused by that
    zigzag = np.zeros((200_000, 2), np.float32)
    zigzag[:, 0] = np.linspace(0, 1, len(zigzag))
    zigzag[1::2, 1] = 479
    one = Shape(1, "polygon", zigzag.tobytes(), (len(zigzag),))
    assert one.cost(640, 480) > MAX_DRAWN_PIXELS > 2 * 480  # the box alone is 2 x 480
    with pytest.raises(TargetError, match="would cost"):
        drawn((640, 480), [one], "w")
    # decoding a compressed RLE costs per character, whatever the image's size
    long = [Shape(1, "rle", b"1" * (2 << 20), ())] * 3
    with pytest.raises(TargetError, match="would cost"):
        drawn((100, 100), long, "w")
    drawn((100, 100), long[:1], "w")  # one of them is within the budget
    far = np.asarray([0, 0, 2.0**31, 0, 0, 4], np.float32).tobytes()  # Pillow would wrap it
    for hand_made, why in (  # a catalog built by hand is checked again before drawing
        (Drawn((4, 4), (Shape(300, "rle", b"", ()),)), "not an integer 0..255"),
        (Drawn((4, 4), (Shape(1, "polygon", tiny, (2,)),)), "fewer than 3 points"),
        (Drawn((4, 4), (Shape(1, "polygon", tiny[:20], (3,)),)), "do not match"),
        (Drawn((4, 4), (Shape(1, "circle", b"", ()),)), "neither a polygon"),
        (Drawn((0, 4), ()), "of size"),
        (Drawn((4.0, 4), ()), "of size"),  # type: ignore[arg-type]
        (Drawn((4, 4), [Shape(1, "rle", b"", ())]), "not a tuple of Shape"),  # type: ignore[arg-type]
        (Drawn((4, 4), (Shape(True, "rle", b"", ()),)), "not an integer 0..255"),
        (Drawn((4, 4), (Shape(1, "rle", "01", ()),)), "not bytes"),  # type: ignore[arg-type]
        (Drawn((4, 4), (Shape(1, "rle", b"\xff1", ()),)), "not ASCII"),
        (Drawn((4, 4), (Shape(1, "polygon", tiny, [3]),)), "not bytes with a tuple"),  # type: ignore[arg-type]
        (Drawn((4, 4), (Shape(1, "polygon", far, (3,)),)), "beyond"),
    ):
        with pytest.raises(TargetError, match=why):
            check_value(Column("segmentation", "mask"), hand_made)
    with pytest.raises(TargetError, match="mask too large"):
        draw(Drawn((100, 100), ()), 9_999)
    many = {i: f"c{i:03d}" for i in range(MAX_MASK_CLASSES + 1)}
    w = write_coco_dataset(tmp_path / "many", images=2, categories=many, unannotated=0)
    with pytest.raises(ValueError, match="uint8 segmentation mask"):
        discover(w.root, coco=ANN, coco_masks=True)
    assert discover(w.root, coco=ANN).schema[0].kind == "boxes"  # boxes take any count
    with pytest.raises(ValueError, match="give coco= too"):
        discover(w.root, coco_masks=True)
