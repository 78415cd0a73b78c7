"""H5MultiDataset with ``target=``: several assets' target columns read as one (boxes, text, the
class in the union mapping), batched like one asset's, refused when their columns differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.multi import H5MultiDataset
from tests.fixtures.targets_data import (
    sample_rows,
    write_coco_dataset,
    write_listing_with_columns,
)

TARGET = ["class", "boxes", "caption"]
CONFIG = PackConfig(ImageConfig(resize="resize", size=(24, 32)))


def _asset(tmp: Path, name: str, labels: tuple[str, ...]) -> str:
    """A listing asset of 6 samples with every target kind; the same rows (the same
    columns and classes) whatever ``labels`` are."""
    rows = sample_rows(6)
    for i, row in enumerate(rows):
        row["label"] = labels[i % len(labels)]
    w = write_listing_with_columns(tmp / name, rows)
    return pack(w.root, tmp / f"{name}.h5", listing=w.listing.name, config=CONFIG).path


def _same_boxes(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_targets_of_several_assets_read_as_one_in_the_union_mapping(tmp_path: Path) -> None:
    a, b = _asset(tmp_path, "a", ("x", "y")), _asset(tmp_path, "b", ("y", "z"))
    multi = H5MultiDataset([a, b], target=TARGET, remap=True)
    assert multi.classes == ["x", "y", "z"]  # b's labels renumbered
    parts = [H5ImageDataset(p, target=TARGET) for p in (a, b)]
    want = [part[i] for part in parts for i in range(len(part))]
    owners = [part for part in parts for _ in range(len(part))]
    assert len(multi) == len(want) == 12
    for k, (image, target) in enumerate(want):
        got_image, got = multi[k]
        assert torch.equal(got_image, image)
        assert multi.classes[got["class"]] == owners[k].classes[target["class"]]
        _same_boxes(got["boxes"], target["boxes"])
        assert got["caption"] == target["caption"]
    order = [11, 0, 6, 5, 3, 8]  # across both assets, out of order
    images, batch = multi.read_batch(order)
    assert tuple(images.shape) == (6, 3, 24, 32)
    assert batch["class"].tolist() == [multi[k][1]["class"] for k in order]
    assert batch["caption"] == [want[k][1]["caption"] for k in order]
    for boxes, k in zip(batch["boxes"], order, strict=True):
        _same_boxes(boxes, want[k][1]["boxes"])
    for image, k in zip(images, order, strict=True):
        assert torch.equal(image, want[k][0])


@pytest.mark.slow
def test_the_loader_s_workers_read_several_assets_targets(tmp_path: Path) -> None:
    a, b = _asset(tmp_path, "a", ("x",)), _asset(tmp_path, "b", ("x",))
    multi = H5MultiDataset([a, b], target="boxes")
    want = sum(len(multi[k][1]["boxes"]) for k in range(len(multi)))
    assert want > 0
    seen, boxes = 0, 0
    for images, targets in multi.loader(4, num_workers=2, multiprocessing_context="spawn"):
        assert len(targets) == len(images)
        seen += len(images)
        boxes += sum(len(t["boxes"]) for t in targets)
    assert (seen, boxes) == (len(multi), want)


def test_assets_whose_target_columns_differ_are_refused_naming_both(tmp_path: Path) -> None:
    manifest = _asset(tmp_path, "a", ("x",))
    coco = write_coco_dataset(tmp_path / "coco", images=3, unannotated=0)
    other = pack(coco.root, tmp_path / "coco.h5", coco="annotations/instances.json").path
    with pytest.raises(ValueError, match="need the same columns") as refused:
        H5MultiDataset([manifest, other], target="boxes", remap=True)
    assert "coco.h5" in str(refused.value)
    assert "a.h5" in str(refused.value)
    assert len(H5MultiDataset([manifest, other], remap=True)) == 9  # classes alone: fine
