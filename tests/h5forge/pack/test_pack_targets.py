"""Packing target columns (format version 2): encoded in the worker, stored, read back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from h5forge.asset import format as fmt
from h5forge.discover.catalog import UNLABELLED, Catalog, Sample
from h5forge.errors import TooManyBadImagesError
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.dataset import H5ImageDataset
from h5forge.scale.parts import pack_part
from h5forge.scale.plan import plan_parts
from h5forge.targets.columns import Columns
from h5forge.targets.schema import Column, parse_schema
from h5forge.verify.checks import verify

SCHEMA = (
    Column("tags", "multilabel", classes=("a", "b", "c")),
    Column("boxes", "boxes", classes=("cat", "dog")),
    Column("seg", "mask"),
    Column("caption", "text"),
    Column("score", "number", dtype="float64"),
)
BACKGROUND, COLOUR = (90, 90, 90), (230, 20, 20)


def scene(
    folder: Path,
    name: str,
    size: tuple[int, int],
    rect: tuple[int, int, int, int],
    cls: int = 3,
    orientation: int = 1,
) -> tuple[Path, Path]:
    """A PNG of ``size`` (W, H), plain with a filled rectangle, and the mask of the rectangle,
    both in the file's pixel grid; the PNG carries the EXIF ``orientation``."""
    img = Image.new("RGB", size, BACKGROUND)
    img.paste(COLOUR, rect)
    mask = np.zeros(size[::-1], np.uint8)
    mask[rect[1] : rect[3], rect[0] : rect[2]] = cls
    path, mask_path = folder / f"{name}.png", folder / f"{name}-mask.png"
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(path, exif=exif)
    Image.fromarray(mask).save(mask_path)
    return path, mask_path


def catalog(
    root: Path,
    rows: list[tuple[Path, tuple[object, ...]]],
    schema: tuple[Column, ...] = SCHEMA,
    rejected: tuple[tuple[str, str], ...] = (),
) -> Catalog:
    samples = tuple(Sample(str(p), p.name, 0, "", t) for p, t in rows)
    return Catalog(str(root), samples, (UNLABELLED,), (), {}, schema, rejected)


CONFIGS = {
    "decoded": PackConfig(image=ImageConfig(resize="resize", size=(15, 20))),
    "encoded": PackConfig(
        image=ImageConfig(layout="encoded", encoding="png", resize="resize", size=(15, 20))
    ),
}


@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_pack_writes_version_2_with_every_column_read_back(tmp_path, layout):
    """Three samples: two packed (their targets moved with the 2x downscale), one whose mask
    is of another size quarantined in the worker, one rejected at discovery."""
    rect = (4, 6, 20, 16)  # in the 40 x 30 source: (2, 3, 10, 8) once halved
    one, one_mask = scene(tmp_path, "one", (40, 30), rect)
    two, two_mask = scene(tmp_path, "two", (40, 30), (0, 0, 40, 30), cls=1)
    bad, _ = scene(tmp_path, "bad", (40, 30), rect)
    rows = [
        (one, ((0, 2), ((*rect, 1, 0),), str(one_mask), "héllo", 0.25)),
        (bad, ((), (), str(two_mask.with_name("small.png")), "", 1.0)),
        (two, ((1,), (), str(two_mask), "", -3.5)),
    ]
    Image.new("L", (8, 8)).save(tmp_path / "small.png")
    cat = catalog(tmp_path, rows, rejected=(("gone.png", "bad target: no such mask"),))
    out = tmp_path / "out.h5"
    result = pack(cat, out, config=CONFIGS[layout], workers=1, max_bad_fraction=0.5)

    assert result.num_samples == 2
    assert result.target_stats == {
        "tags": {"samples": 2, "per_class": {"a": 1, "b": 1, "c": 1}, "empty": 0},
        "boxes": {
            "samples": 2,
            "boxes": 1,
            "per_image_mean": 0.5,
            "per_image_max": 1,
            "dropped": 0,
            "per_class": {"dog": 1},
        },
        # 20 x 15 masks: the 8 x 5 rectangle of 3s, and one of 1s only
        "seg": {
            "samples": 2,
            "pixels": {"0": 300 - 40, "1": 300, "3": 40},
            "images": {"0": 1, "1": 1, "3": 1},
        },
        "caption": {"samples": 2, "mean_bytes": 3.0, "max_bytes": 6},  # é is 2 bytes
        "score": {"samples": 2, "min": -3.5, "max": 0.25, "mean": -1.625},
    }
    assert dict(result.quarantined) == {
        "gone.png": "bad target: no such mask",
        "bad.png": "bad target: mask of another size: 8 x 8, the image is 40 x 30",
    }
    with h5py.File(out, "r") as h5:
        assert h5.attrs[fmt.A_VERSION] == fmt.TARGETS_VERSION
        schema = parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="test")
        want = "raw" if layout == "decoded" else "png"
        assert [c.encoding for c in schema] == ["", "", want, "", ""]
        assert list(h5[fmt.QUARANTINE_PATHS].asstr()) == ["gone.png", "bad.png"]
        cols = Columns(h5, schema)
        assert cols.get("tags", 0).tolist() == [0, 2]
        assert cols.get("tags", 1).tolist() == [1]
        assert cols.get("boxes", 0).tolist() == [[2, 3, 10, 8, 1, 0]]
        assert cols.get("boxes", 1).shape == (0, 6)
        mask = cols.get("seg", 0)
        assert mask.shape == (15, 20)
        assert Image.fromarray(mask).getbbox() == (2, 3, 10, 8)
        assert set(np.unique(mask)) == {0, 3}
        assert (cols.get("seg", 1) == 1).all()
        assert [cols.get("caption", i) for i in (0, 1)] == ["héllo", ""]
        assert [cols.get("score", i) for i in (0, 1)] == [0.25, -3.5]
        # each sample's value in each column is one byte range of the file
        with open(out, "rb") as f:
            for c in schema:
                for i, (at, n) in enumerate(cols.ranges(c.name)):
                    f.seek(int(at))
                    assert f.read(int(n)) == cols.raw(c.name, i)
    ds = H5ImageDataset(out)
    assert len(ds) == 2
    image, label = ds[0]
    assert label == 0
    assert tuple(image.shape) == (3, 15, 20)  # CHW
    assert image[:, 5, 5].tolist() == list(COLOUR)


def test_a_pack_without_targets_stays_version_1(tmp_path):
    path, _ = scene(tmp_path, "one", (40, 30), (4, 6, 20, 16))
    out = tmp_path / "out.h5"
    pack(catalog(tmp_path, [(path, ())], schema=()), out, config=CONFIGS["decoded"], workers=1)
    with h5py.File(out, "r") as h5:
        assert h5.attrs[fmt.A_VERSION] == fmt.FORMAT_VERSION
        assert fmt.A_TARGETS_JSON not in h5.attrs
        assert fmt.TARGETS not in h5


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_targets_come_back_through_worker_processes(tmp_path, layout):
    """Enough samples for the process pool (decoded: through the shared-memory ring; encoded:
    the pipe): every sample's box and mask are its own, in order."""
    rows = []
    for k in range(12):
        rect = (2 * k, 2, 2 * k + 8, 12)
        path, mask = scene(tmp_path, f"s{k:02d}", (40, 30), rect)
        rows.append((path, ((k % 3,), ((*rect, 0, 0),), str(mask), f"n{k}", float(k))))
    out = tmp_path / "out.h5"
    pack(catalog(tmp_path, rows), out, config=CONFIGS[layout], workers=2)
    with h5py.File(out, "r") as h5:
        cols = Columns(h5, parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="test"))
        for k in range(12):
            assert cols.get("boxes", k).tolist() == [[k, 1, k + 4, 6, 0, 0]]
            assert Image.fromarray(cols.get("seg", k)).getbbox() == (k, 1, k + 4, 6)
            assert cols.get("caption", k) == f"n{k}"


GEOMETRY = {
    "decoded-resize": ImageConfig(resize="resize", size=(36, 28)),
    "decoded-shorter-side": ImageConfig(resize="shorter-side", size=(24, 24)),
    "encoded-png-shorter-side": ImageConfig(
        layout="encoded", encoding="png", resize="shorter-side", size=(24, 24)
    ),
    "encoded-original": ImageConfig(
        layout="encoded", encoding="original", resize="shorter-side", size=(24, 24)
    ),
}


def _colour_bbox(chw: np.ndarray) -> tuple[int, int, int, int]:
    """Where the rectangle's colour is in a stored image (bilinear edges blend half way)."""
    r, g = chw[0].astype(int), chw[1].astype(int)
    ys, xs = np.nonzero((r > 160) & (g < 100))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("config", sorted(GEOMETRY))
def test_box_mask_and_pixels_agree_after_exif_and_resize(tmp_path, config, orientation):
    """The box, the mask's nonzero bbox and the rectangle's pixels in the stored image are
    the same place (within the pixel bilinear resampling blurs), whatever the EXIF
    orientation, resize policy and layout."""
    rect = (10, 8, 30, 20)  # in the 64 x 48 file grid, before EXIF
    path, mask = scene(tmp_path, "s", (64, 48), rect, orientation=orientation)
    schema = (Column("boxes", "boxes", classes=("thing",)), Column("seg", "mask"))
    cat = catalog(tmp_path, [(path, (((*rect, 0, 0),), str(mask)))], schema=schema)
    out = tmp_path / "out.h5"
    result = pack(cat, out, config=PackConfig(image=GEOMETRY[config]), workers=1)
    assert result.target_stats["boxes"]["dropped"] == 0
    image = H5ImageDataset(out)[0][0].numpy()
    with h5py.File(out, "r") as h5:
        cols = Columns(h5, parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="test"))
        box = cols.get("boxes", 0)[0, :4]
        stored_mask = cols.get("seg", 0)
    assert stored_mask.shape == image.shape[1:]  # the mask has its image's size
    mask_bbox = Image.fromarray(stored_mask).getbbox()
    assert mask_bbox is not None
    assert np.abs(box - np.asarray(mask_bbox)).max() <= 1, (box, mask_bbox)
    assert np.abs(np.asarray(mask_bbox) - _colour_bbox(image)).max() <= 1


def test_boxes_the_crop_removes_are_dropped_and_counted(tmp_path):
    """Shorter-side 24 of a 64 x 48 image: 32 x 24, centre crop 24 x 24 cuts 4 px each side
    at the resized scale (8 source px): a box inside the first 8 source columns is gone."""
    path, mask = scene(tmp_path, "s", (64, 48), (10, 8, 30, 20))
    boxes = ((10, 8, 30, 20, 0, 0), (0, 0, 6, 48, 0, 1), (0, 0, 20, 10, 0, 0))
    schema = (Column("boxes", "boxes", classes=("thing",)),)
    cat = catalog(tmp_path, [(path, (boxes,))], schema=schema)
    out = tmp_path / "out.h5"
    result = pack(cat, out, config=PackConfig(image=GEOMETRY["decoded-shorter-side"]), workers=1)
    stats = result.target_stats["boxes"]
    assert (stats["boxes"], stats["dropped"]) == (2, 1)
    with h5py.File(out, "r") as h5:
        stored = Columns(h5, parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="t")).get("boxes", 0)
    # the third box is clipped at the crop's left edge: source x 8 -> 0
    assert stored[:, :4].tolist() == [[1, 4, 11, 10], [0, 0, 6, 5]]


def _two_samples(tmp_path: Path) -> Catalog:
    rows = []
    for k in range(2):
        path, mask = scene(tmp_path, f"s{k}", (40, 30), (4, 6, 20, 16))
        rows.append((path, ((k,), ((4, 6, 20, 16, 0, 0),), str(mask), f"c{k}", 1.0)))
    return catalog(tmp_path, rows)


def test_an_incremental_pack_with_targets_reuses_nothing_and_says_why(tmp_path, caplog):
    cat = _two_samples(tmp_path)
    first, second = tmp_path / "v1.h5", tmp_path / "v2.h5"
    pack(cat, first, config=CONFIGS["decoded"], workers=1)
    reuse = Reuse(path=str(first), unchanged=frozenset(s.relpath for s in cat.samples))
    with caplog.at_level("WARNING", logger="h5forge.pack.reuse"):
        result = pack(cat, second, config=CONFIGS["decoded"], workers=1, reuse=reuse)
    assert result.reused == 0
    assert "the catalog has target columns ['tags', 'boxes', 'seg', 'caption', 'score']" in (
        caplog.text
    )
    with h5py.File(second, "r") as h5:
        cols = Columns(h5, parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="test"))
        assert [cols.get("caption", i) for i in range(2)] == ["c0", "c1"]


def test_a_dask_build_refuses_target_columns_naming_the_option(tmp_path):
    cat = _two_samples(tmp_path)
    with pytest.raises(ValueError, match="executor='local'"):
        plan_parts(cat, samples_per_part=1)
    # the worker's side too, before any work
    plain = catalog(tmp_path, [(Path(cat.samples[0].path), ())], schema=())
    spec = plan_parts(plain, samples_per_part=1)[0]
    with pytest.raises(ValueError, match=r"target columns \['tags'"):
        pack_part(cat, spec, str(tmp_path / "staging"), config=CONFIGS["decoded"])
    assert not (tmp_path / "staging").exists()


def test_a_version_2_file_opens_and_verifies_over_s3(
    tmp_path, s3_bucket, s3_storage_options, s3_requests
):
    out = tmp_path / "v2.h5"
    pack(_two_samples(tmp_path), out, config=CONFIGS["encoded"], workers=1)
    url = f"s3://{s3_bucket}/v2.h5"
    publish(str(out), url, storage_options=s3_storage_options)
    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    assert len(ds) == 2
    # The file's HEAD and its sidecar's GET go out side by side: either may be logged first.
    assert sorted(r.method for r in s3_requests()[:2]) == ["GET", "HEAD"]
    report = verify(url, storage_options=s3_storage_options)
    assert (report.format_version, report.checked_samples) == (fmt.TARGETS_VERSION, 2)


def test_rejected_rows_count_against_max_bad_fraction(tmp_path):
    cat = _two_samples(tmp_path)
    cat = replace(cat, rejected=(("lost.png", "bad target: no mask file"),))
    with pytest.raises(TooManyBadImagesError, match=r"(?s)1 of 3 inputs .* lost.png: bad target"):
        pack(cat, tmp_path / "out.h5", config=CONFIGS["decoded"], workers=1)
    assert not (tmp_path / "out.h5").exists()


def test_a_value_breaking_its_rule_is_quarantined_by_the_worker(tmp_path):
    """A catalog built by hand is checked again where the sample is encoded."""
    cat = _two_samples(tmp_path)
    bad = replace(cat.samples[1], targets=((9,), *cat.samples[1].targets[1:]))
    cat = replace(cat, samples=(cat.samples[0], bad))
    result = pack(
        cat, tmp_path / "out.h5", config=CONFIGS["decoded"], workers=1, max_bad_fraction=0.5
    )
    assert result.num_samples == 1
    assert result.quarantined == (
        ("s1.png", "bad target: column 'tags': class index 9 is outside 0..2"),
    )
