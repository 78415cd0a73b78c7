"""The per-file sources map beside a version: counted, bounded, removed by retention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from h5forge.location import MAX_LINEAGE_BYTES, Location
from h5forge.pack.writer import PackResult
from h5forge.publish.lineage import (
    count_changes,
    read_sources,
    sources_url,
    write_sources,
)
from h5forge.publish.release import publish_version


def test_changes_are_counted_by_path_and_token() -> None:
    old = {"a": "1:1", "b": "2:2", "c": "3:3"}
    new = {"a": "1:1", "b": "2:9", "d": "4:4", "e": "5:5"}
    assert count_changes(old, new) == {"added": 2, "removed": 1, "replaced": 1}


def test_a_map_round_trips_and_a_missing_one_is_none(tmp_path: Path) -> None:
    version = str(tmp_path / "v" / "x" / "set.h5")
    assert read_sources(Location(version)) is None
    assert write_sources(Location(version), {"a/1.jpg": "3:4"})
    assert read_sources(Location(version)) == {"a/1.jpg": "3:4"}
    assert not write_sources(Location(version), {"big": "y" * MAX_LINEAGE_BYTES})
    assert read_sources(Location(version)) == {"a/1.jpg": "3:4"}  # the bound left the old map alone


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "not JSON"),
        (json.dumps({"format": "other", "files": {}}).encode(), "not an h5forge sources map"),
        (json.dumps({"format": "h5forge-sources", "files": {"a": 1}}).encode(), "sources map"),
        (b" " * (MAX_LINEAGE_BYTES + 1), "over"),
    ],
)
def test_a_hostile_map_is_refused(tmp_path: Path, body: bytes, match: str) -> None:
    version = str(tmp_path / "set.h5")
    Path(sources_url(version)).write_bytes(body)
    with pytest.raises(ValueError, match=match):
        read_sources(Location(version))


def test_retention_removes_a_versions_sources_map_and_its_folder(
    tmp_path: Path, packed_decoded: PackResult, packed_encoded: PackResult
) -> None:
    base = str(tmp_path / "set")
    old = publish_version(packed_decoded.path, Location(base))
    write_sources(Location(old.url), {"a": "1:1"})
    new = publish_version(packed_encoded.path, Location(base), keep_versions=1)
    assert new.removed == (old.url,)
    assert not Path(old.url).parent.exists()
