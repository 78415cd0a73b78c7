"""``build-h5-dataset`` on sources with targets (#15): a COCO folder and a segmentation folder
built under a real Prefect test server; the report states the targets, the published asset
reads them back, the preview draws them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.fixtures.prefect import flow_run_artifacts
from tests.fixtures.targets_data import write_coco_dataset, write_paired_folder

pytestmark = pytest.mark.slow


def _report(state: Any) -> str:
    run_id = state.state_details.flow_run_id
    (report,) = [a for a in flow_run_artifacts(run_id) if (a.key or "").startswith("build-report")]
    return str(report.data)


def test_a_coco_source_builds_reports_its_boxes_and_masks_and_reads_them_back(
    prefect_harness: str, fetch_cache: Path, tmp_path: Path
) -> None:
    coco = write_coco_dataset(tmp_path / "coco", images=12, unannotated=2)
    dest = tmp_path / "out" / "coco.h5"
    config = BuildConfig(
        source=str(coco.root),
        destination=str(dest),
        coco="annotations/instances.json",
        coco_masks=True,
        resize="none",
        size=224,
        smoke_workers=0,
    )
    state = build_dataset(config, cache_dir=str(fetch_cache), return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary.num_samples == 12
    masks = H5ImageDataset(str(dest), target="segmentation")
    for i in range(len(masks)):  # drawn from the triangles: each of its image's size
        image, mask = masks[i]
        assert tuple(mask.shape) == tuple(image.shape[1:])
    report = _report(state)
    assert "## Targets" in report
    total = sum(len(b) for b in coco.boxes.values())
    assert f"boxes {total}" in report  # the column's figures: every box stored
    assert verify(str(dest)).sha256 == summary.sha256  # raises on any failed check
    ds = H5ImageDataset(str(dest), target="boxes")
    assert sum(len(ds[i][1]["boxes"]) for i in range(len(ds))) == total
    assert Path(str(dest) + ".preview.png").stat().st_size > 0


def test_a_segmentation_folder_builds_with_its_masks(
    prefect_harness: str, fetch_cache: Path, tmp_path: Path
) -> None:
    seg = write_paired_folder(tmp_path / "seg", splits=("train", "val"), per_split=3, value=5)
    dest = tmp_path / "out" / "seg.h5"
    config = BuildConfig(
        source=str(seg.root),
        destination=str(dest),
        masks="masks",
        resize="resize",
        size=32,
        smoke_workers=0,
    )
    state = build_dataset(config, cache_dir=str(fetch_cache), return_state=True)
    assert state.is_completed(), state.message
    assert "## Targets" in _report(state)
    for split in ("train", "val"):
        ds = H5ImageDataset(str(dest), split=split, target="mask")
        assert len(ds) == 3
        for i in range(3):
            values = set(np.unique(np.asarray(ds[i][1])).tolist())
            assert values <= {0, 5}
            assert 5 in values


def test_the_form_refuses_two_layouts_and_targets_on_dask_before_any_work() -> None:
    with pytest.raises(ValidationError, match="name two source layouts"):
        BuildConfig(source="/d", destination="/o.h5", listing="m.csv", masks="masks")
    with pytest.raises(ValidationError, match="give coco"):
        BuildConfig(source="/d", destination="/o.h5", coco_masks=True)
    with pytest.raises(ValidationError, match="apply to executor='local' only"):
        BuildConfig(
            source="/d",
            destination="/o.h5",
            coco="a.json",
            executor="dask",
            dask_address="tcp://127.0.0.1:8786",
        )
