"""The markdown build report (a pure function) and artifact keys."""

from __future__ import annotations

import pytest

from h5forge.pack.writer import PackResult
from h5forge.publish.storage import PublishResult
from h5forge.smoke.load import MethodReport, SmokeReport
from h5forge.tasks.pack import artifact_key
from h5forge.tasks.report import render_report, viewable_url


def _render(quarantined: int) -> str:
    pack = PackResult(
        path="/w/x.h5",
        num_samples=10,
        num_quarantined=quarantined,
        num_classes=2,
        classes=("a|b", "c"),
        quarantined=tuple((f"c/bad{i}.jpg", "zero-byte file") for i in range(quarantined)),
        counts={"train": {"a|b": 4, "c": 3}, "val": {"a|b": 2, "c": 1}},
        bytes=1000,
        seconds=1.0,
    )
    smoke = SmokeReport(
        url="/w/x.h5",
        workers=2,
        batch_size=32,
        methods=(
            MethodReport(
                "fork", samples=4, seconds=0.5, startup_seconds=0.1, images_per_second=900.0
            ),
            MethodReport(
                "spawn", samples=4, seconds=3.5, startup_seconds=3.2, images_per_second=400.0
            ),
        ),
        samples_checked=8,
        seconds=4.0,
    )
    published = PublishResult(
        url="s3://b/x.h5",
        sidecar_url="s3://b/x.h5.manifest.json",
        sha256="f" * 64,
        bytes=2_000_000,
        unchanged=False,
    )
    return render_report(
        dataset="x.h5",
        source="https://h/x.tgz",
        pack=pack,
        smoke=smoke,
        published=published,
        preview="s3://b/x.h5.preview.png",
        format_version=1,
        stage_seconds={"fetch": 1.0, "pack": 2.0, "smoke-load": 4.0, "publish": 0.5},
    )


def test_report_has_counts_per_class_and_split_timings_and_smoke_rates() -> None:
    md = _render(quarantined=1)
    assert "| class | train | val | total |" in md
    assert "| a\\|b | 4 | 2 | 6 |" in md  # class names cannot break the table
    assert "| **total** | 7 | 3 | **10** |" in md
    assert "| pack | 2.00 | 5 img/s |" in md
    assert "| publish | 0.50 | 4.0 MB/s |" in md
    assert "fork: 900 img/s" in md
    assert "spawn: 400 img/s" in md
    assert "`c/bad0.jpg` | zero-byte file" in md
    assert "[x.h5.preview.png](s3://b/x.h5.preview.png)" in md


def test_a_long_quarantine_is_cut_in_the_report_and_points_to_the_table() -> None:
    md = _render(quarantined=60)
    assert "bad49.jpg" in md
    assert "bad50.jpg" not in md
    assert "10 more in the quarantine table artifact" in md


def test_local_paths_become_links_a_browser_follows(tmp_path: object) -> None:
    assert viewable_url("/data/x.png") == "file:///data/x.png"
    assert viewable_url("s3://b/x.png") == "s3://b/x.png"


@pytest.mark.parametrize(
    ("kind", "dataset", "key"),
    [
        ("build-report", "demo.h5", "build-report-demo-h5"),
        ("quarantine", "My Data_v2.h5", "quarantine-my-data-v2-h5"),
        ("preview", "--x--.h5", "preview-x-h5"),
    ],
)
def test_artifact_keys_use_only_what_prefect_allows(kind: str, dataset: str, key: str) -> None:
    assert artifact_key(kind, dataset) == key
