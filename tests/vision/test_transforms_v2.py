"""Targets as torchvision tv_tensors through ``torchvision.transforms.v2``: a flip and a crop
move the boxes and the mask with the object's pixels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

v2 = pytest.importorskip(
    "torchvision.transforms.v2",
    reason="torchvision is not installed here; `make test-vision` runs these in .venv-vision",
)
from torchvision import tv_tensors  # noqa: E402

from h5forge.pack.config import PackConfig  # noqa: E402
from h5forge.pack.writer import pack  # noqa: E402
from h5forge.preprocess.config import ImageConfig  # noqa: E402
from h5forge.read.dataset import H5ImageDataset  # noqa: E402
from tests.vision.conftest import H, W  # noqa: E402
from tests.vision.scenes import OBJECT, rect  # noqa: E402

CROP = (40, 44)


def _object_pixels(image: torch.Tensor) -> torch.Tensor:
    """(H, W) bool: where the image shows the object's colour."""
    want = torch.tensor(OBJECT, dtype=image.dtype).view(3, 1, 1)
    return (image.as_subclass(torch.Tensor) == want).all(dim=0)


def _crowd_too(sample: tuple) -> tuple:
    """SanitizeBoundingBoxes' labels_getter: drop a removed box's ``iscrowd`` with its label
    (its default keeps only ``labels`` in step with the boxes)."""
    return sample[1]["labels"], sample[1]["iscrowd"]


def _flip_and_crop(size: tuple[int, int], *, iscrowd: bool) -> v2.Compose:
    """With ``iscrowd`` the boxes dicts hold it and it goes with its box; without, the dict is
    ``boxes`` and ``labels``, which SanitizeBoundingBoxes' default getter finds itself."""
    getter = _crowd_too if iscrowd else "default"
    return v2.Compose(
        [
            v2.RandomHorizontalFlip(p=1.0),
            v2.RandomCrop(size),
            v2.SanitizeBoundingBoxes(labels_getter=getter),
        ]
    )


def _check_boxes_on_object(image: torch.Tensor, target: dict) -> int:
    """Every box is the object's pixel extent; returns how many boxes there were."""
    on = _object_pixels(image)
    ys, xs = torch.nonzero(on, as_tuple=True)
    boxes = target["boxes"]
    assert {len(target[key]) for key in target} == {len(boxes)}  # labels, iscrowd with them
    if not len(xs):  # cropped away: SanitizeBoundingBoxes removed its boxes
        assert len(boxes) == 0
        return 0
    extent = [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]
    for box in boxes.tolist():
        assert box == pytest.approx(extent)
    return len(boxes)


@pytest.mark.parametrize("iscrowd", [False, True])
def test_detection_sample_through_flip_and_crop_keeps_boxes_on_the_object(scenes, iscrowd):
    path, raws = scenes
    ds = H5ImageDataset(path, target="boxes", iscrowd=iscrowd)
    image, target = ds[0]
    assert sorted(target) == (["boxes", "iscrowd", "labels"] if iscrowd else ["boxes", "labels"])
    assert isinstance(image, tv_tensors.Image)
    assert isinstance(target["boxes"], tv_tensors.BoundingBoxes)
    assert target["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY
    assert tuple(target["boxes"].canvas_size) == (H, W)
    torch.manual_seed(0)
    kept, total = 0, 0
    for size in (CROP, (16, 16)):  # the small crop loses some objects, the large one keeps them
        transform = _flip_and_crop(size, iscrowd=iscrowd)
        for i in range(len(ds)):
            image, target = transform(*ds[i])
            assert tuple(image.shape) == (3, *size)
            kept += _check_boxes_on_object(image, target)
            total += len(raws[i]["objects"])
            assert [raws[i]["objects"][0][4]] * len(target["labels"]) == target["labels"].tolist()
            if iscrowd:
                crowd = [raws[i]["objects"][0][5]] * len(target["iscrowd"])
                assert crowd == target["iscrowd"].tolist()
    assert 0 < kept < total  # some boxes kept, some removed: neither check was vacuous


def test_mask_sample_through_the_same_flip_stays_aligned(scenes):
    path, _ = scenes
    ds = H5ImageDataset(path, target="mask")
    image, mask = ds[3]
    assert isinstance(image, tv_tensors.Image)
    assert isinstance(mask, tv_tensors.Mask)
    assert torch.equal(mask.as_subclass(torch.Tensor) != 0, _object_pixels(image))
    torch.manual_seed(1)
    transform = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.RandomCrop(CROP)])
    for i in range(len(ds)):
        image, mask = transform(*ds[i])
        assert isinstance(mask, tv_tensors.Mask)
        assert tuple(mask.shape) == CROP
        assert torch.equal(mask.as_subclass(torch.Tensor) != 0, _object_pixels(image))


@pytest.mark.slow
def test_transforms_run_in_loader_workers_and_batch_as_lists(scenes):
    path, _ = scenes
    ds = H5ImageDataset(path, target=["boxes", "mask"], transforms=v2.RandomHorizontalFlip(1.0))
    loader = ds.loader(4, num_workers=1, multiprocessing_context="fork")
    seen = 0
    for images, targets in loader:
        assert tuple(images.shape) == (4, 3, H, W)
        assert tuple(targets["seg"].shape) == (4, H, W)
        assert len(targets["objects"]) == 4
        for k, boxes in enumerate(targets["objects"]):
            assert isinstance(boxes["boxes"], tv_tensors.BoundingBoxes)
            assert torch.equal(targets["seg"][k] != 0, _object_pixels(images[k]))
            _check_boxes_on_object(images[k], boxes)
            seen += 1
    assert seen == len(ds)


def _coco_scenes(root: Path, n: int) -> Path:
    """``n`` PNG scenes (the dark image, one OBJECT rectangle) and a COCO instances file with
    each rectangle as its bbox and as a polygon through its corner pixels' centres-left-top
    (Pillow fills a polygon's edges too: corners a..b-1 cover pixels a..b-1 exactly)."""
    images, annotations = [], []
    for i in range(n):
        x1, y1, x2, y2 = rect(i, (W, H))
        pixels = np.full((H, W, 3), 10, np.uint8)
        pixels[y1:y2, x1:x2] = OBJECT
        name = f"img/{i:03d}.png"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / name)
        images.append({"id": i, "file_name": name, "width": W, "height": H})
        corners = [x1, y1, x2 - 1, y1, x2 - 1, y2 - 1, x1, y2 - 1]
        annotations.append(
            {
                "id": i + 1,
                "image_id": i,
                "category_id": 3,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "iscrowd": 0,
                "segmentation": [corners],
            }
        )
    data = {"images": images, "annotations": annotations, "categories": [{"id": 3, "name": "cat"}]}
    (root / "instances.json").write_text(json.dumps(data), encoding="utf-8")
    return root


def test_coco_boxes_and_drawn_masks_through_flip_and_crop_stay_on_the_object(tmp_path):
    """A COCO source with ``coco_masks``: the drawn ``segmentation`` mask is a
    ``tv_tensors.Mask`` that the same flip and crop keep on the object, with its boxes."""
    root = _coco_scenes(tmp_path / "coco", 6)
    out = tmp_path / "coco.h5"
    config = PackConfig(ImageConfig(resize="none", size=None))
    pack(root, out, coco="instances.json", coco_masks=True, config=config, workers=1)
    ds = H5ImageDataset(out, target=["boxes", "segmentation"], iscrowd=True)
    image, target = ds[0]
    assert isinstance(target["segmentation"], tv_tensors.Mask)
    seg = target["segmentation"].as_subclass(torch.Tensor)
    assert torch.equal(seg == 1, _object_pixels(image))  # 1 + the class index of "cat"
    torch.manual_seed(2)
    transform = v2.Compose(
        [
            v2.RandomHorizontalFlip(p=1.0),
            v2.RandomCrop(CROP),
            v2.SanitizeBoundingBoxes(labels_getter=lambda s: _crowd_too((s[0], s[1]["boxes"]))),
        ]
    )
    kept = 0
    for i in range(len(ds)):
        image, target = transform(*ds[i])
        mask = target["segmentation"]
        assert isinstance(mask, tv_tensors.Mask)
        assert torch.equal(mask.as_subclass(torch.Tensor) != 0, _object_pixels(image))
        kept += _check_boxes_on_object(image, target["boxes"])
    assert kept > 0


def test_standard_dataloader_images_are_pure_tensors_to_v2(scenes):
    """The images ``__getitems__`` returns (h5forge.read.stacked.BatchImage) are pure tensors to
    transforms.v2, which returns plain tensors; through the standard DataLoader the batches are
    torch's stack of the same transform applied to ``ds[i]``."""
    from torch.utils.data import DataLoader

    path, _ = scenes
    tf = v2.Compose([v2.RandomHorizontalFlip(1.0), v2.CenterCrop(CROP)])
    raw = H5ImageDataset(path)
    image = raw.__getitems__([0, 1])[0][0]
    assert type(image).__name__ == "BatchImage"
    out = tf(image)
    assert type(out) is torch.Tensor
    assert torch.equal(out, tf(raw[0][0]))
    loader = DataLoader(
        H5ImageDataset(path, transform=tf),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="fork",
    )
    for k, (images, labels) in enumerate(loader):
        assert type(images) is torch.Tensor
        assert torch.equal(images, torch.stack([tf(raw[i][0]) for i in range(4 * k, 4 * k + 4)]))
        assert labels.tolist() == [raw[i][1] for i in range(4 * k, 4 * k + 4)]


def test_loader_boxes_are_what_the_public_constructor_makes(scenes):
    """A loader batch's boxes are made with ``BoundingBoxes._wrap`` (the pinned torchvision
    passes the one-time comparison); each equals, in type, attributes and values, the box the
    public constructor makes of the same rows and canvas, and ``ds[i]``'s box."""
    from h5forge.read.tv import xyxy_boxes

    assert xyxy_boxes().__name__ == "wrapped"
    path, _ = scenes
    ds = H5ImageDataset(path, target="boxes")
    loader = ds.loader(4, num_workers=1, multiprocessing_context="fork")
    seen = 0
    for _, targets in loader:
        for t in targets:
            box = t["boxes"]
            hw = tuple(box.canvas_size)
            public = tv_tensors.BoundingBoxes(
                box.as_subclass(torch.Tensor).clone(), format="XYXY", canvas_size=hw
            )
            assert type(box) is type(public)
            assert box.__dict__ == public.__dict__
            one = ds[seen][1]["boxes"]
            assert torch.equal(box, public)
            assert torch.equal(box, one)
            assert one.__dict__ == public.__dict__
            seen += 1
    assert seen == len(ds)
