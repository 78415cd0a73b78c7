"""Packing target columns (format version 2): encoded in the worker, stored, read back."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from h5forge.asset import format as fmt
from h5forge.discover.catalog import UNLABELLED, Catalog, Sample
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset
from h5forge.targets.columns import Columns
from h5forge.targets.schema import Column, parse_schema

SCHEMA = (
    Column("tags", "multilabel", classes=("a", "b", "c")),
    Column("boxes", "boxes", classes=("cat", "dog")),
    Column("seg", "mask"),
    Column("caption", "text"),
    Column("score", "number", dtype="float64"),
)
BACKGROUND, COLOUR = (90, 90, 90), (230, 20, 20)


def scene(
    folder: Path, name: str, size: tuple[int, int], rect: tuple[int, int, int, int], cls: int = 3
) -> tuple[Path, Path]:
    """A PNG of ``size`` (W, H), plain with a filled rectangle, and the mask of the rectangle."""
    img = Image.new("RGB", size, BACKGROUND)
    img.paste(COLOUR, rect)
    mask = np.zeros(size[::-1], np.uint8)
    mask[rect[1] : rect[3], rect[0] : rect[2]] = cls
    path, mask_path = folder / f"{name}.png", folder / f"{name}-mask.png"
    img.save(path)
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
def test_targets_come_back_through_worker_processes(tmp_path):
    """Enough samples for the process pool (and the decoded ring): every sample's box and
    mask are its own, in order."""
    rows = []
    for k in range(12):
        rect = (2 * k, 2, 2 * k + 8, 12)
        path, mask = scene(tmp_path, f"s{k:02d}", (40, 30), rect)
        rows.append((path, ((k % 3,), ((*rect, 0, 0),), str(mask), f"n{k}", float(k))))
    out = tmp_path / "out.h5"
    pack(catalog(tmp_path, rows), out, config=CONFIGS["decoded"], workers=2)
    with h5py.File(out, "r") as h5:
        cols = Columns(h5, parse_schema(h5.attrs[fmt.A_TARGETS_JSON], where="test"))
        for k in range(12):
            assert cols.get("boxes", k).tolist() == [[k, 1, k + 4, 6, 0, 0]]
            assert Image.fromarray(cols.get("seg", k)).getbbox() == (k, 1, k + 4, 6)
            assert cols.get("caption", k) == f"n{k}"
