"""Synthetic scenes whose targets are known exactly: a dark image with one bright rectangle,
its box and its mask, packed as an asset with target columns (used by tests/vision and
tests/h5forge/read/test_read_targets.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from h5forge.discover.catalog import UNLABELLED, Catalog, Sample
from h5forge.targets.schema import Column

OBJECT = (200, 30, 30)  # the rectangle's colour; the background is (10, 10, 10)
TAGS = ("a", "b", "c")
SCHEMA = (
    Column("tags", "multilabel", classes=TAGS),
    Column("objects", "boxes", classes=("cat", "dog")),
    Column("seg", "mask"),
    Column("caption", "text"),
    Column("score", "number", dtype="float64"),
)


def rect(i: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Scene ``i``'s rectangle ``(x1, y1, x2, y2)`` inside an image of ``size`` (W, H)."""
    w, h = size
    x1, y1 = 3 + (5 * i) % (w // 2), 2 + (3 * i) % (h // 2)
    return x1, y1, x1 + w // 4 + i % 5, y1 + h // 4 + i % 3


def write_scenes(
    root: Path, n: int, *, size: tuple[int, int] = (64, 48), schema=SCHEMA
) -> tuple[Catalog, list[dict[str, object]]]:
    """``n`` scenes under ``root``: the Catalog to pack and each sample's raw values."""
    root.mkdir(parents=True, exist_ok=True)
    samples, raws = [], []
    for i in range(n):
        x1, y1, x2, y2 = rect(i, size)
        pixels = np.full((size[1], size[0], 3), 10, np.uint8)
        pixels[y1:y2, x1:x2] = OBJECT
        mask = np.zeros((size[1], size[0]), np.uint8)
        mask[y1:y2, x1:x2] = 1 + i % 3
        image_path, mask_path = root / f"img{i:03d}.png", root / f"img{i:03d}.mask.png"
        Image.fromarray(pixels).save(image_path)
        Image.fromarray(mask).save(mask_path)
        raw: dict[str, object] = {
            "tags": tuple(sorted({i % 3, (i * 2) % 3})),
            "objects": ((x1, y1, x2, y2, i % 2, 0),) * (1 + i % 2),
            "seg": str(mask_path),
            "caption": f"scene {i}: één rectangle",
            "score": i / 4,
        }
        raws.append(raw)
        samples.append(
            Sample(
                str(image_path),
                image_path.name,
                0,
                "",
                tuple(raw[c.name] for c in schema),
            )
        )
    catalog = Catalog(str(root), tuple(samples), (UNLABELLED,), (), {}, schema=tuple(schema))
    return catalog, raws
