"""The preview's target overlay: masks tint only their pixels, boxes are outlined where they are."""

from __future__ import annotations

import numpy as np
from PIL import Image

from h5forge.location import Location
from h5forge.publish.overlay import PALETTE, draw_targets
from h5forge.targets.schema import Column

SCHEMA = (Column("boxes", "boxes", classes=("cat", "dog")), Column("mask", "mask"))


def test_mask_tints_its_pixels_only_and_boxes_outline_their_edges():
    pic = Image.new("RGB", (60, 40), (255, 255, 255))
    mask = np.zeros((40, 60), np.uint8)
    mask[5:15, 10:30] = 3
    values = {
        "mask": mask,
        "boxes": {"boxes": np.array([[35.0, 20.0, 55.0, 38.0]]), "labels": np.array([1])},
        "caption": "ignored",
    }
    out = np.asarray(draw_targets(pic, values, SCHEMA))
    tinted = out[5:15, 10:30]
    assert (tinted != 255).any(axis=2).all()  # every mask pixel is tinted
    want = np.round(255 * 0.55 + np.array(PALETTE[3]) * 0.45)
    assert np.array_equal(tinted[0, 0], want.astype(np.uint8))
    assert (out[0:5] == 255).all()  # the background is untouched
    assert (out[15:20, 0:35] == 255).all()
    assert tuple(out[20, 45]) == PALETTE[1]  # the box's top edge, in class 1's colour
    assert tuple(out[30, 35]) == PALETTE[1]  # its left edge
    assert (out[33:36, 38:52] == 255).all()  # inside the outline, below its name: the image


def test_a_mask_of_another_size_is_not_drawn_and_images_without_targets_pass():
    pic = Image.new("RGB", (8, 8), (9, 9, 9))
    out = draw_targets(pic, {"mask": np.ones((4, 4), np.uint8)}, SCHEMA)
    assert np.array_equal(np.asarray(out), np.asarray(pic))
    assert np.array_equal(np.asarray(draw_targets(pic, {}, ())), np.asarray(pic))


def test_the_preview_of_a_segmentation_asset_tints_each_mask_and_nothing_else(tmp_path):
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack
    from h5forge.preprocess.config import ImageConfig
    from h5forge.publish.preview import render_preview
    from h5forge.read.dataset import H5ImageDataset
    from tests.fixtures.targets_data import write_paired_folder

    seg = write_paired_folder(tmp_path / "seg", splits=(), per_split=4, value=3)
    out = tmp_path / "seg.h5"
    pack(
        seg.root,
        out,
        masks="masks",
        workers=1,
        config=PackConfig(ImageConfig(resize="resize", size=(32, 32))),
    )
    grid = np.asarray(render_preview(Location(str(out)), n=4, tile=32))
    ds = H5ImageDataset(str(out), target=["mask"])
    for k in range(4):  # a 2 x 2 grid of 32 x 32 tiles (plus a caption row under each)
        image, target = ds[k]
        image = np.asarray(image.permute(1, 2, 0))
        mask = np.asarray(target["mask"]) == 3
        y, x = (k // 2) * (32 + 14), (k % 2) * 32
        tile = grid[y : y + 32, x : x + 32]
        assert mask.any()
        assert np.array_equal(tile[~mask], image[~mask])  # the image, where there is no mask
        assert (tile[mask] != image[mask]).any(axis=1).mean() > 0.9  # tinted where there is
