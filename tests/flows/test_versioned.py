"""build-h5-dataset with versioned=True: no-op builds, lineage in the sidecar and the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fsspec
import h5py
import pytest

from h5forge.demo import write_image_folder
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.location import Location
from h5forge.publish.lineage import read_sources
from h5forge.publish.versions import read_pointer


def _source(root: Path) -> Path:
    write_image_folder(root, classes=("ant", "bee"), per_class=4, seed=3)
    return root


def _build(config: BuildConfig, cache: Path) -> tuple[Any, Any]:
    state = build_dataset(config, cache_dir=str(cache), return_state=True)
    assert state.is_completed(), state.message
    return state, state.result()


def _objects(url: str, options: dict[str, Any]) -> dict[str, Any]:
    fs, path = fsspec.core.url_to_fs(url, **options)
    fs.invalidate_cache()
    return {
        k: (v["size"], v.get("ETag") or v.get("mtime"))
        for k, v in fs.find(path, detail=True).items()
    }


def _sidecar(url: str, options: dict[str, Any]) -> dict[str, Any]:
    with fsspec.open(url + ".manifest.json", **options) as f:
        return dict(json.load(f))


def test_a_local_source_unchanged_touched_and_reconfigured(
    prefect_harness: str, tmp_path: Path
) -> None:
    src = _source(tmp_path / "src")
    pub = tmp_path / "pub"
    config = BuildConfig(
        source=str(src),
        destination=str(pub / "set.h5"),
        versioned=True,
        smoke_workers=0,
        size=32,
        max_shard_size="off",  # one file per version (sharded: tests/flows/test_sharded_flow.py)
    )
    state, first = _build(config, tmp_path / "cache")
    assert not first.unchanged
    assert first.destination.endswith(f"/set/v/{first.version}/set.h5")
    assert first.version == first.sha256[:16]
    sidecar = _sidecar(first.destination, {})
    assert sidecar["parent"] == ""
    assert sidecar["config_sha256"] == config.pack_config().sha256()
    assert sidecar["flow_run_id"] == str(state.state_details.flow_run_id)
    assert "changes" not in sidecar  # no parent to compare with
    files = read_sources(Location(first.destination))
    assert files is not None
    assert len(files) == 8
    with h5py.File(first.destination) as h5:
        assert h5.attrs["parent_sha256"] == ""
        assert h5.attrs["source_fingerprint"] == sidecar["source_fingerprint"]
        assert h5.attrs["flow_run_id"] == sidecar["flow_run_id"]
        assert "changes_json" not in h5.attrs

    before = _objects(str(pub), {})
    pointer = (pub / "set.latest.json").read_bytes()
    _, again = _build(config, tmp_path / "cache")
    assert again.unchanged
    assert (again.version, again.sha256) == (first.version, first.sha256)
    assert again.num_samples == first.num_samples
    assert "fetch" not in again.seconds
    assert _objects(str(pub), {}) == before  # nothing published, nothing rewritten
    assert (pub / "set.latest.json").read_bytes() == pointer

    touched = next(iter(sorted(src.rglob("*.*"))))
    st = os.stat(touched)
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, second = _build(config, tmp_path / "cache")
    assert not second.unchanged
    assert second.version != first.version
    sidecar = _sidecar(second.destination, {})
    assert sidecar["parent"] == first.sha256
    assert sidecar["changes"] == {"added": 0, "removed": 0, "replaced": 1}
    with h5py.File(second.destination) as h5:
        assert h5.attrs["parent_sha256"] == first.sha256
        assert json.loads(h5.attrs["changes_json"]) == sidecar["changes"]
    pointed = read_pointer(Location(str(pub / "set")))
    assert pointed is not None
    assert pointed.sha256 == second.sha256

    _, third = _build(config.model_copy(update={"size": 24}), tmp_path / "cache")
    assert not third.unchanged
    assert _sidecar(third.destination, {})["changes"] == {"added": 0, "removed": 0, "replaced": 0}


@pytest.mark.parametrize("layout", ["sharded", "one file"])
def test_an_s3_asset_is_not_rebuilt_when_nothing_changed(
    prefect_harness: str,
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    layout: str,
) -> None:
    from prefect.blocks.system import Secret

    Secret(value=s3_storage_options).save("h5forge-test-noop", overwrite=True)
    src = _source(tmp_path / "src")
    base = f"s3://{s3_bucket}/assets/set"
    config = BuildConfig(
        source=str(src),
        destination=base + ".h5",
        credentials_block="h5forge-test-noop",
        versioned=True,
        smoke_workers=0,
        size=32,
        max_shard_size="64MiB" if layout == "sharded" else "off",
    )
    name = "set.version.json" if layout == "sharded" else "set.h5"
    _, first = _build(config, tmp_path / "cache")
    assert not first.unchanged
    before = _objects(f"s3://{s3_bucket}", s3_storage_options)
    assert f"{s3_bucket}/assets/set/v/{first.version}/{name}.sources.json" in before
    _, again = _build(config, tmp_path / "cache")
    assert again.unchanged
    assert again.sha256 == first.sha256
    assert _objects(f"s3://{s3_bucket}", s3_storage_options) == before
    (src / "ant" / "extra.png").write_bytes(
        (src / "bee").joinpath(sorted(os.listdir(src / "bee"))[0]).read_bytes()
    )
    _, grown = _build(config, tmp_path / "cache")
    assert not grown.unchanged
    assert grown.num_samples == first.num_samples + 1
    assert grown.reused == first.num_samples
    if layout == "one file":
        changes = _sidecar(f"{base}/v/{grown.version}/set.h5", s3_storage_options)["changes"]
    else:
        with fsspec.open(f"{base}/v/{grown.version}/{name}", **s3_storage_options) as f:
            changes = json.loads(json.load(f)["lineage"]["changes_json"])
    assert changes == {"added": 1, "removed": 0, "replaced": 0}


@pytest.mark.parametrize("versioned", [False, True])
def test_versioned_is_a_documented_form_field(versioned: bool) -> None:
    schema = BuildConfig.model_json_schema()["properties"]["versioned"]
    assert "BASE.latest.json" in schema["description"]
    assert BuildConfig(source="/x", destination="/y.h5", versioned=versioned).versioned is versioned


def test_a_changed_source_is_built_incrementally_and_equals_a_full_build(
    prefect_harness: str, tmp_path: Path
) -> None:
    from h5forge.pack.writer import pack

    src = _source(tmp_path / "src")
    pub = tmp_path / "pub"
    config = BuildConfig(  # one file per version (sharded: tests/flows/test_sharded_flow.py)
        source=str(src),
        destination=str(pub / "set.h5"),
        versioned=True,
        smoke_workers=0,
        size=32,
        max_shard_size="off",
    )
    _, first = _build(config, tmp_path / "cache")
    assert first.reused == 0  # nothing to reuse yet
    replaced = sorted((src / "bee").iterdir())[0]
    write_image_folder(tmp_path / "other", classes=("bee",), per_class=1, seed=99)
    replaced.write_bytes(next((tmp_path / "other" / "bee").iterdir()).read_bytes())
    write_image_folder(tmp_path / "more", classes=("ant",), per_class=1, seed=42)
    added = next((tmp_path / "more" / "ant").iterdir())
    (src / "ant" / f"new-{added.name}").write_bytes(added.read_bytes())

    _, second = _build(config, tmp_path / "cache")
    assert not second.unchanged
    assert second.num_samples == 9
    assert second.reused == 7  # every sample but the replaced and the added one
    assert _sidecar(second.destination, {})["changes"] == {
        "added": 1,
        "removed": 0,
        "replaced": 1,
    }
    full = pack(src, tmp_path / "full.h5", config=config.pack_config(), workers=1)
    with h5py.File(second.destination) as inc, h5py.File(full.path) as ref:
        for name in ("paths", "labels", "classes", "digests", "shapes"):
            if name in ref:
                assert inc[name][()].tolist() == ref[name][()].tolist(), name
        assert inc["images"][()].tobytes() == ref["images"][()].tobytes()


@pytest.mark.parametrize("layout", ["sharded", "one file"])
def test_the_re_verify_flow_checks_the_version_the_pointer_names(
    prefect_harness: str, tmp_path: Path, layout: str
) -> None:
    from h5forge.flows.verify import verify_asset

    src = _source(tmp_path / "src")
    dest = str(tmp_path / "pub" / "set.h5")
    config = BuildConfig(
        source=str(src),
        destination=dest,
        versioned=True,
        smoke_workers=0,
        max_shard_size="64MiB" if layout == "sharded" else "off",
    )
    _, built = _build(config, tmp_path / "cache")
    assert not os.path.exists(dest)  # a versioned asset has no file at the destination
    verified = verify_asset(dest, sample_fraction=1.0)
    name = "set.version.json" if layout == "sharded" else "set.h5"
    assert verified["path"].endswith(f"/set/v/{built.version}/{name}")
    assert verified["sha256"] == built.sha256
