"""build-h5-dataset versioned: retention from the form, and one asset materialisation per
version carrying that version's lineage."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from h5forge.demo import write_image_folder
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.location import Location
from h5forge.publish.history import list_versions
from h5forge.publish.versions import read_pointer
from h5forge.tasks.publish import asset_key
from tests.fixtures.prefect import asset_events

GOOD: dict[str, Any] = {"source": "/data/flowers", "destination": "/assets/flowers.h5"}


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("keep_versions", 0, "keep_versions=0 must be an integer >= 1"),
        ("keep_versions", -3, "keep_versions=-3 must be an integer >= 1"),
        ("min_age_s", -1, "min_age_s=-1.0 must be a finite number of seconds >= 0"),
        ("min_age_s", float("inf"), "min_age_s=inf must be a finite number of seconds >= 0"),
    ],
)
def test_the_form_refuses_bad_retention_with_publish_versions_message(
    field: str, value: Any, words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        BuildConfig(**GOOD, versioned=True, **{field: value})


def test_retention_fields_are_documented_with_their_defaults() -> None:
    config = BuildConfig(**GOOD)
    assert (config.keep_versions, config.min_age_s) == (5, 86_400.0)
    schema = BuildConfig.model_json_schema()["properties"]
    assert schema["keep_versions"]["minimum"] == 1
    assert "BASE.latest.json" in schema["keep_versions"]["description"]
    assert schema["min_age_s"]["minimum"] == 0
    assert "one day" in schema["min_age_s"]["description"]


def _touch(path: Path, seconds: int) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


def _events(key: str, n: int, wait_s: float = 30.0) -> list[Any]:
    """The asset's materialisation events, once there are ``n`` (they arrive asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        events = asset_events(key)
        if len(events) >= n or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def test_retention_and_lineage_of_each_version_through_the_flow(
    prefect_harness: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    write_image_folder(src, classes=("ant", "bee"), per_class=4, seed=5)
    dest = str(tmp_path / "pub" / "set.h5")
    config = BuildConfig(
        source=str(src),
        destination=dest,
        versioned=True,
        keep_versions=2,
        min_age_s=0,
        smoke_workers=0,
        size=32,
    )
    files = sorted(src.rglob("*.*"))
    built = []
    runs = []
    for k in range(3):
        if k:
            _touch(files[k], k)
        state = build_dataset(config, cache_dir=str(tmp_path / "cache"), return_state=True)
        assert state.is_completed(), state.message
        built.append(state.result())
        runs.append(str(state.state_details.flow_run_id))
    kept = [v.sha256 for v in list_versions(Location(dest))]
    assert kept == [built[1].sha256, built[2].sha256]  # the oldest went, keep_versions=2
    assert not os.path.exists(built[0].destination)
    pointer = read_pointer(Location(dest))
    assert pointer is not None
    assert pointer.sha256 == built[2].sha256

    # A minimum age of an hour keeps every version, whatever keep_versions says.
    _touch(files[3], 3)
    state = build_dataset(
        config.model_copy(update={"min_age_s": 3600.0}),
        cache_dir=str(tmp_path / "cache"),
        return_state=True,
    )
    assert state.is_completed(), state.message
    built.append(state.result())
    runs.append(str(state.state_details.flow_run_id))
    assert [v.sha256 for v in list_versions(Location(dest))] == [b.sha256 for b in built[1:]]

    events = _events(asset_key(dest), 4)
    by_version = {e.payload["version"]: e.payload for e in events}
    assert set(by_version) == {b.version for b in built}
    for k, b in enumerate(built):
        payload = by_version[b.version]
        assert payload["sha256"] == b.sha256
        assert payload["parent_sha256"] == (built[k - 1].sha256 if k else "")
        assert payload["flow_run_id"] == runs[k]
        assert payload["config_sha256"] == config.pack_config().sha256()
        assert len(payload["source_fingerprint"]) == 64
        if k:  # one file touched since the parent: one replaced
            assert (payload["added"], payload["removed"], payload["replaced"]) == (0, 0, 1)
    assert by_version[built[2].version]["removed_versions"] == [built[0].destination]
    assert by_version[built[3].version]["removed_versions"] == []
