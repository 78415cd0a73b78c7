"""``h5forge pack`` with the source layouts of #15: --coco, --masks, --listing with --columns;
the packed file read back (format 2, its columns), and the refusals before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

from h5forge.targets.columns import Columns
from h5forge.targets.schema import parse_schema
from tests.fixtures.targets_data import (
    sample_rows,
    write_coco_dataset,
    write_listing_with_columns,
    write_paired_folder,
)

_PY = [sys.executable, "-m", "h5forge.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_PY, *args], capture_output=True, text=True, timeout=300, check=False)


def _columns(path: Path) -> tuple[dict[str, str], h5py.File, Columns]:
    h5 = h5py.File(path, "r")
    assert int(h5.attrs["format_version"]) == 2
    schema = parse_schema(h5.attrs["targets_json"], where=str(path))
    return {c.name: c.kind for c in schema}, h5, Columns(h5, schema)


def test_pack_coco_stores_every_image_with_its_boxes(tmp_path: Path) -> None:
    coco = write_coco_dataset(tmp_path / "src", images=6, unannotated=1)
    out = tmp_path / "coco.h5"
    r = _cli(
        "pack",
        str(coco.root),
        str(out),
        "--coco",
        "annotations/instances.json",
        "--resize",
        "none",
        "--size",
        "none",
        "--workers",
        "1",
    )
    assert r.returncode == 0, r.stderr
    kinds, h5, cols = _columns(out)
    with h5:
        assert kinds == {"boxes": "boxes"}
        paths = h5["paths"].asstr()[()].tolist()
        assert sorted(paths) == sorted(coco.boxes)
        for i, path in enumerate(paths):  # resize none: the source's pixels, XYXY
            got = cols.get("boxes", i)
            want = [(x, y, x + w, y + h) for x, y, w, h, _, _ in coco.boxes[path]]
            assert got[:, :4].tolist() == [list(map(float, b)) for b in want]
            assert got[:, 5].tolist() == [float(b[5]) for b in coco.boxes[path]]


def test_pack_coco_masks_draws_a_segmentation_mask_per_image(tmp_path: Path) -> None:
    coco = write_coco_dataset(tmp_path / "src", images=4, unannotated=1)
    out = tmp_path / "coco.h5"
    args = ["--coco", "annotations/instances.json", "--coco-masks", "--workers", "1"]
    r = _cli("pack", str(coco.root), str(out), *args, "--resize", "none", "--size", "none")
    assert r.returncode == 0, r.stderr
    kinds, h5, cols = _columns(out)
    with h5:
        assert kinds == {"boxes": "boxes", "segmentation": "mask"}
        paths = h5["paths"].asstr()[()].tolist()
        for i, path in enumerate(paths):
            mask = cols.get("segmentation", i)
            assert mask.shape == coco.sizes[path][::-1]  # (H, W) of the image
            # the fixture's annotations are triangles: painted where an annotation lies
            assert bool(mask.any()) == bool(coco.boxes[path])
    shown = _cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "targets:      boxes (boxes, 3 classes), segmentation (mask, raw)" in shown.stdout
    listed = json.loads(_cli("inspect", str(out), "--json").stdout)["targets"]
    assert [(c["name"], c["kind"]) for c in listed] == [
        ("boxes", "boxes"),
        ("segmentation", "mask"),
    ]


def test_pack_masks_stores_a_mask_per_image(tmp_path: Path) -> None:
    seg = write_paired_folder(tmp_path / "seg", splits=(), per_split=4)
    out = tmp_path / "seg.h5"
    r = _cli(
        "pack",
        str(seg.root),
        str(out),
        "--masks",
        "masks",
        "--size",
        "32",
        "--resize",
        "resize",
        "--workers",
        "1",
    )
    assert r.returncode == 0, r.stderr
    kinds, h5, cols = _columns(out)
    with h5:
        assert kinds == {"mask": "mask"}
        assert len(h5["paths"]) == 4
        for i in range(4):
            mask = cols.get("mask", i)
            assert mask.shape == (32, 32)
            assert set(np.unique(mask).tolist()) <= {0, seg.value}
            assert (mask == seg.value).any()


def test_pack_listing_columns_given_on_the_command_line(tmp_path: Path) -> None:
    written = write_listing_with_columns(tmp_path / "m", sample_rows(6))
    out = tmp_path / "m.h5"
    r = _cli(
        "pack",
        str(written.root),
        str(out),
        "--listing",
        written.listing.name,
        "--columns",
        "tags=multilabel,caption=text",
        "--workers",
        "1",
    )
    assert r.returncode == 0, r.stderr
    kinds, h5, cols = _columns(out)
    with h5:
        assert kinds == {"tags": "multilabel", "caption": "text"}  # the others ignored
        by_path = {row["path"]: row for row in written.rows}
        classes = parse_schema(h5.attrs["targets_json"], where="m")[0].classes
        for i, path in enumerate(h5["paths"].asstr()[()].tolist()):
            assert cols.get("caption", i) == by_path[path]["caption"]
            assert [classes[k] for k in cols.get("tags", i)] == by_path[path]["tags"]


def test_two_layouts_or_bad_columns_are_refused_before_any_work(tmp_path: Path) -> None:
    for args, message in (
        (["--listing", "a.csv", "--coco", "b.json"], "name two source layouts"),
        (["--columns", "tags=video"], "kind 'video'"),
        (["--columns", "tags=multilabel"], "describes a sample listing"),
        (["--coco-masks"], "give coco"),
    ):
        r = _cli("pack", str(tmp_path / "nowhere"), str(tmp_path / "o.h5"), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == "[]"
