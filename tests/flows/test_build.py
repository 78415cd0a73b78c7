"""``build-h5-dataset`` under a real Prefect test server, on the built-in demo archive."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic import ValidationError

from h5forge.errors import IntegrityError, TooManyBadImagesError
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.read.dataset import H5ImageDataset
from h5forge.tasks.publish import asset_key
from h5forge.verify.checks import verify
from tests.fixtures.damage import flip_sample_byte
from tests.fixtures.images import BIG_SIDE, RAISED_MAX_PIXELS, big_image_tree
from tests.fixtures.prefect import asset_events, flow_run_artifacts, flow_run_task_runs

pytestmark = pytest.mark.slow

DEMO_BROKEN = {"train/amber/broken_zero.jpg", "val/cobalt/broken_truncated.png"}


def _by_key(flow_run_id: Any) -> dict[str, Any]:
    return {a.key: a for a in flow_run_artifacts(flow_run_id) if a.key}


def _task_states(flow_run_id: Any) -> dict[str, str]:
    """Stage name (``fetch``, ``pack`` ...) -> final state name, for one flow run."""
    return {t.name.split("[", 1)[0]: t.state.name for t in flow_run_task_runs(flow_run_id)}


def _config(built: Any, dest: Path, **changes: Any) -> BuildConfig:
    fields = built.config.model_dump()
    fields.update(destination=str(dest), **changes)
    return BuildConfig(**fields)


# --------------------------------------------------------------------------- the happy path


def test_build_completes_and_the_published_asset_verifies(built: Any) -> None:
    summary = built.summary
    report = verify(str(built.dest))
    assert report.sha256 == summary.sha256
    assert report.bytes == summary.bytes == built.dest.stat().st_size
    assert (summary.num_samples, summary.num_classes, summary.num_quarantined) == (300, 4, 2)
    assert summary.counts["train"] == {"amber": 60, "cobalt": 60, "jade": 60, "ruby": 60}
    assert summary.counts["val"] == {"amber": 15, "cobalt": 15, "jade": 15, "ruby": 15}
    assert list(summary.seconds) == [
        "fetch",
        "discover",
        "pack",
        "verify",
        "smoke-load",
        "preview",
        "publish",
    ]
    assert set(summary.smoke_per_method) == {"fork", "spawn"}
    assert summary.smoke_images_per_second == min(summary.smoke_per_method.values()) > 0

    sidecar = json.loads(Path(str(built.dest) + ".manifest.json").read_text())
    assert (sidecar["sha256"], sidecar["bytes"]) == (summary.sha256, summary.bytes)
    assert sidecar["num_samples"] == 300
    with Image.open(str(built.dest) + ".preview.png") as png:
        assert png.format == "PNG"
        assert png.width > 96
        assert png.height > 96


def test_build_records_report_table_link_and_progress_artifacts(built: Any) -> None:
    artifacts = _by_key(built.state.state_details.flow_run_id)
    assert {
        "build-report-demo-h5",
        "quarantine-demo-h5",
        "preview-demo-h5",
        "pack-progress-demo-h5",
    } <= set(artifacts)

    report = artifacts["build-report-demo-h5"]
    assert report.type == "markdown"
    for expected in (
        "| amber | 60 | 15 | 75 |",
        "broken_zero.jpg",
        "broken_truncated.png",
        "## Stages",
        "| smoke-load |",
        "img/s",
        built.summary.sha256,
        "demo.h5.preview.png",
    ):
        assert expected in report.data

    table = json.loads(artifacts["quarantine-demo-h5"].data)
    assert {row["path"] for row in table} == DEMO_BROKEN
    assert all(row["reason"] for row in table)

    link = artifacts["preview-demo-h5"]
    assert (Path(str(built.dest) + ".preview.png").as_uri()) in link.data

    assert artifacts["pack-progress-demo-h5"].type == "progress"
    assert float(artifacts["pack-progress-demo-h5"].data) == pytest.approx(100.0)


def test_build_materialises_the_asset_with_its_metadata(built: Any) -> None:
    key = asset_key(str(built.dest))
    assert key == built.summary.asset_key == "file://" + str(built.dest.resolve())
    events = asset_events(key)
    assert events, f"no materialization event for {key}"
    payload = events[0].payload
    assert payload["sha256"] == built.summary.sha256
    assert payload["bytes"] == built.summary.bytes
    assert payload["num_samples"] == 300
    assert payload["format_version"] == 1


def test_stage_task_runs_are_named_after_the_dataset(built: Any) -> None:
    names = {t.name for t in flow_run_task_runs(built.state.state_details.flow_run_id)}
    assert {
        "fetch[demo.h5]",
        "discover[demo.h5]",
        "pack[demo.h5]",
        "verify[demo.h5]",
        "smoke-load[demo.h5]",
        "preview[demo.h5]",
        "publish[demo.h5]",
    } <= names


def test_second_run_is_served_from_the_fetch_cache(built: Any, tmp_path: Path) -> None:
    assert _task_states(built.state.state_details.flow_run_id)["fetch"] == "Completed"
    again = _config(built, tmp_path / "again.h5", smoke_workers=0)
    state = build_dataset(again, cache_dir=str(built.cache_dir), return_state=True)
    assert state.is_completed(), state.message
    assert _task_states(state.state_details.flow_run_id)["fetch"] == "Cached"
    verify(str(tmp_path / "again.h5"))


# --------------------------------------------------------------------------- failures


def _flip_first_sample_byte(task: Any, task_run: Any, state: Any) -> None:
    """``on_completion`` hook of the pack task: a bit flip in the packed file, on disk.

    It stands for what verify exists to catch (a bad disk, a buggy copy) between packing and
    publishing; the real pack, verify and publish code runs unchanged around it.
    """
    flip_sample_byte(state.result().path, 0, mask=0xFF, at=0)


def test_a_failing_verify_fails_the_run_and_publishes_nothing(
    built: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import h5forge.flows.build
    from h5forge.tasks.pack import pack_images

    corrupting = pack_images.with_options(on_completion=[_flip_first_sample_byte])
    monkeypatch.setattr(h5forge.flows.build, "pack_images", corrupting)
    out = tmp_path / "published"
    state = build_dataset(
        _config(built, out / "demo.h5"), cache_dir=str(built.cache_dir), return_state=True
    )
    assert state.is_failed()
    with pytest.raises(IntegrityError, match="sample 0"):
        state.result()
    stages = _task_states(state.state_details.flow_run_id)
    assert stages["verify"] == "Failed"
    assert "smoke-load" not in stages
    assert "publish" not in stages
    assert not out.exists() or not any(out.iterdir())


def test_too_many_bad_images_fails_the_run_publishes_nothing_and_lists_them(
    built: Any, tmp_path: Path
) -> None:
    out = tmp_path / "published"
    config = _config(built, out / "strict.h5", max_bad_fraction=0.0)
    state = build_dataset(config, cache_dir=str(built.cache_dir), return_state=True)
    assert state.is_failed()
    with pytest.raises(TooManyBadImagesError):
        state.result()
    table = json.loads(_by_key(state.state_details.flow_run_id)["quarantine-strict-h5"].data)
    assert {row["path"] for row in table} == DEMO_BROKEN
    assert not out.exists() or not any(out.iterdir())


def test_an_existing_destination_fails_before_any_work_without_overwrite(built: Any) -> None:
    before = built.dest.stat().st_mtime_ns
    state = build_dataset(
        _config(built, built.dest), cache_dir=str(built.cache_dir), return_state=True
    )
    assert state.is_failed()
    with pytest.raises(FileExistsError, match="overwrite"):
        state.result()
    assert flow_run_task_runs(state.state_details.flow_run_id) == []
    assert built.dest.stat().st_mtime_ns == before


# --------------------------------------------------------------------------- BuildConfig


GOOD = {"source": "/data/flowers.tar.gz", "destination": "/assets/flowers.h5"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source": "ftps2://host/x.tar"}, "fsspec does not know"),
        ({"source": ""}, "empty"),
        ({"source": "https://user:pw@example.org/x.tar.gz"}, "embeds credentials"),
        ({"source": "https://example.org/x.tgz?X-Amz-Signature=abc"}, "embeds credentials"),
        ({"destination": "/assets/flowers.hdf5"}, "must end in .h5"),
        ({"destination": "https://example.org/flowers.h5"}, "read-only"),
        ({"destination": "nope://bucket/flowers.h5"}, "fsspec does not know"),
        ({"sha256": "abc"}, "64 hexadecimal"),
        ({"size": -1}, r"size -1 is out of range: height and width must be 8\.\.4096"),
        ({"size": 5000}, "size 5000 is out of range"),
        ({"size": 224, "width": 7}, "size 224x7 is out of range"),
        ({"workers": 0}, r"workers=0 must be an int in 1\.\.1024"),
        ({"smoke_workers": -1}, "greater than or equal to 0"),
        ({"max_bad_fraction": 1.5}, r"max_bad_fraction=1\.5 must be a number in 0\.\.1"),
        ({"layout": "jpeg"}, "layout='jpeg' is not one of 'decoded', 'encoded'"),
        ({"quality": 0}, r"quality=0 must be an int in 1\.\.100"),
        ({"shorter_side": 100}, r"shorter_side=100 must be an int >= max\(size\) = 224"),
        ({"compression": "zstd", "compression_level": 0}, "out of range for zstd"),
        (
            {"executor": "dask", "dask_address": "tcp://h:8786", "listing": "m.csv"},
            "listing apply to executor='local' only",
        ),
        (
            {"executor": "dask", "dask_address": "tcp://h:8786", "fletcher32": True},
            "fletcher32 apply to executor='local' only",
        ),
        ({"compression_level": 3}, "needs a codec"),
        ({"compression": "gzip", "compression_level": 12}, "out of range for gzip"),
        ({"compression": "gzip", "resize": "none"}, "one size only"),
        ({"encoding": "png"}, "only applies to layout='encoded'"),
        ({"credentials_block": "My Secret"}, "not a block name"),
        ({"bucket_key": "AKIA..."}, "Extra inputs are not permitted"),
        (
            {"source": "/data/flowers", "destination": "/data/flowers/out.h5"},
            "destination /data/flowers/out.h5 is inside the source /data/flowers: ",
        ),
        (
            {"source": "file:///data/flowers/", "destination": "/data/flowers/a/../out.h5"},
            "is inside the source file:///data/flowers/",
        ),
        (
            {"source": "s3://b/data", "destination": "s3://b/data/out.h5"},
            "destination s3://b/data/out.h5 is inside the source s3://b/data: ",
        ),
        (
            {"source": "s3://b/data/", "destination": "s3://b/data.h5", "versioned": True},
            "versions folder s3://b/data is the source s3://b/data/ itself: the run would "
            "replace what it reads; a versioned destination s3://b/data.h5 keeps its versions "
            "under s3://b/data/",
        ),
        (
            {
                "source": "s3://b/data",
                "destination": "s3://b/out.h5",
                "executor": "dask",
                "dask_address": "tcp://h:8786",
                "staging": "s3://b/data/parts",
            },
            "staging s3://b/data/parts is inside the source s3://b/data: ",
        ),
    ],
)
def test_build_config_rejects_bad_values_with_a_clear_message(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        BuildConfig(**{**GOOD, **changes})


@pytest.mark.parametrize(
    "source",
    [
        "/data/folder",
        "relative/folder",
        "s3://bucket/prefix/",
        "gs://b/x.tar.gz",
        "https://example.org/x.tar.gz",
        "memory://x/y.zip",
        "simplecache::s3://b/x.tgz",
    ],
)
def test_build_config_accepts_local_paths_and_fsspec_urls(source: str) -> None:
    config = BuildConfig(source=source, destination="s3://bucket/out.h5", sha256="A" * 64)
    assert config.sha256 == "a" * 64
    assert config.pack_config().image.size == (224, 224)


@pytest.mark.parametrize(
    ("source", "destination"),
    [
        ("s3://b/data", "s3://b/database.h5"),  # a name that only starts alike
        ("s3://b/data", "s3://b/data.h5"),  # beside the source, not in it
        ("s3://b/data", "s3://c/data/out.h5"),  # another bucket
        ("/data/flowers", "s3://b/data/flowers/out.h5"),  # a local path and a URL
    ],
)
def test_build_config_accepts_a_destination_beside_the_source(
    source: str, destination: str
) -> None:
    assert BuildConfig(source=source, destination=destination).destination == destination


def test_build_config_passes_every_image_option_to_the_library() -> None:
    config = BuildConfig(
        **GOOD,
        layout="encoded",
        encoding="webp",
        quality=55,
        size=64,
        width=96,
        shorter_side=120,
        mode="L",
        max_image_pixels=10**6,
    )
    image = config.pack_config().image
    assert (image.quality, image.shorter_side, image.size) == (55, 120, (64, 96))
    assert (image.encoding, image.mode, image.max_image_pixels) == ("webp", "L", 10**6)


def test_a_destination_or_cache_inside_the_source_fails_before_any_task(
    prefect_harness: str, tmp_path: Path
) -> None:
    from h5forge.demo import write_image_folder

    source = tmp_path / "images"
    write_image_folder(source, classes=("a", "b"), per_class=2, size=(20, 20))
    with pytest.raises(ValidationError, match="is inside the source"):  # the form refuses it
        BuildConfig(source=str(source), destination=str(source / "a" / "x.h5"))
    # A cache_dir inside the source (where the fetch would extract, and the next discovery
    # find, copies of the images) fails the run before any task.
    config = BuildConfig(source=str(source), destination=str(tmp_path / "x.h5"))
    state = build_dataset(config, cache_dir=str(source / "cache"), return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="cache folder .* is inside the source .*--cache-dir"):
        state.result()
    assert flow_run_task_runs(state.state_details.flow_run_id) == []
    assert not (source / "cache").exists()
    assert not (tmp_path / "x.h5").exists()


def test_build_config_schema_explains_every_field() -> None:
    schema = BuildConfig.model_json_schema()
    assert set(schema["required"]) == {"source", "destination"}
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{name} has no description for the UI form"
    assert schema["properties"]["size"]["minimum"] == 8


def test_a_build_with_a_raised_pixel_bound_verifies_smoke_loads_and_publishes(
    prefect_harness: str, tmp_path: Path
) -> None:
    # Every stage after the pack (its seal, verify, smoke-load, preview) reads with the
    # build's own max_image_pixels, not the default: an image over the default is packed.
    source = big_image_tree(tmp_path / "images")
    dest = tmp_path / "out" / "big.h5"
    config = BuildConfig(
        source=str(source),
        destination=str(dest),
        layout="encoded",
        encoding="original",
        resize="none",
        mode="L",
        max_image_pixels=RAISED_MAX_PIXELS,
        smoke_workers=0,
    )
    state = build_dataset(config, cache_dir=str(tmp_path / "cache"), return_state=True)
    assert state.is_completed(), state.message
    assert state.result().num_samples == 2
    assert verify(str(dest), max_pixels=RAISED_MAX_PIXELS).num_samples == 2
    assert dest.with_name("big.h5.preview.png").exists()
    shapes = sorted(
        tuple(img.shape) for img, _ in H5ImageDataset(str(dest), max_pixels=RAISED_MAX_PIXELS)
    )
    assert shapes == [(1, 16, 16), (1, BIG_SIDE, BIG_SIDE)]
