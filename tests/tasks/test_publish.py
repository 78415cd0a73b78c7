"""Asset keys and preview location of the publish task."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.assets import Asset

from h5forge.publish.preview import preview_url
from h5forge.tasks.publish import asset_key


@pytest.mark.parametrize(
    ("dest", "key"),
    [
        ("s3://bucket/assets/x.h5", "s3://bucket/assets/x.h5"),
        ("S3://bucket/x.h5", "s3://bucket/x.h5"),
        ("gs://user:pw@bucket/x.h5", "gs://bucket/x.h5"),
        ("simplecache::s3://bucket/x.h5", "s3://bucket/x.h5"),
        ("file:///data/x.h5", "file:///data/x.h5"),
        ("memory://a b/x#1.h5", "memory://a_b/x_1.h5"),
    ],
)
def test_asset_key_is_a_credential_free_uri_prefect_accepts(dest: str, key: str) -> None:
    assert asset_key(dest) == key
    Asset(key=asset_key(dest))  # Prefect's own validation


def test_a_local_path_becomes_an_absolute_file_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert asset_key("out/my data.h5") == f"file://{tmp_path}/out/my_data.h5"
    Asset(key=asset_key("out/my data.h5"))


def test_an_overlong_key_is_shortened_but_stays_unique() -> None:
    a = asset_key("s3://bucket/" + "a" * 600 + "1.h5")
    b = asset_key("s3://bucket/" + "a" * 600 + "2.h5")
    assert len(a) <= 512
    assert len(b) <= 512
    assert a != b
    Asset(key=a)


def test_preview_lies_beside_the_asset() -> None:
    assert preview_url("s3://b/x.h5") == "s3://b/x.h5.preview.png"
