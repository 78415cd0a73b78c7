"""A pinned version opened from the verified cache asks the server nothing (moto S3 on loopback).

A job that read a version once (its latest) leaves that version's bytes in ``cache_dir``: a
sharded version's manifest and shards, a single-file version's whole file, each kept under its
sha256. A later job that pins the version (``version=`` the full sha256, ``ds.version``) opens
and reads it with no request at all, in its own process and in its DataLoader workers; bytes
in the cache that no longer hash to the version are never served (the server is asked again).
Requests are counted at the server.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.release import publish_version
from h5forge.publish.shard_release import build_sharded_version
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.remote_epoch import content, epoch
from tests.fixtures.servers import S3RequestLog

SMALL = 2**20  # the smallest shard size: several shards of a few samples each


def _all(ds: H5ImageDataset) -> Counter[tuple[str, int]]:
    """Every sample, read in this process."""
    return content(ds[i] for i in range(len(ds)))


def _sharded(tmp: Path, url: str, options: dict[str, Any]) -> tuple[str, Counter[tuple[str, int]]]:
    """A sharded version built at ``url``; its sha256 and its samples (read from a local build
    of the same source: the same pixels and labels, another manifest)."""
    src = tmp / "src"
    write_image_folder(src, classes=("cat", "dog"), per_class=10, size=(60, 80))
    built = build_sharded_version(src, Location(url, options), max_shard_size=SMALL, workers=1)
    assert built is not None
    assert built.shards > 1
    local = build_sharded_version(
        src, Location(str(tmp / "local" / "photos")), max_shard_size=SMALL, workers=1
    )
    assert local is not None
    assert local.num_samples == built.num_samples
    return built.sha256, _all(H5ImageDataset(str(tmp / "local" / "photos")))


def _single(tmp: Path, url: str, options: dict[str, Any]) -> tuple[str, Counter[tuple[str, int]]]:
    """A single-file version published at ``url``; its sha256 and its samples."""
    src = tmp / "src"
    write_image_folder(src, classes=("a", "b"), per_class=12, size=(20, 24))
    packed = pack(src, tmp / "a.h5", config=PackConfig(ImageConfig(resize="resize", size=(16, 16))))
    published = publish_version(packed.path, Location(url, options))
    return published.sha256, _all(H5ImageDataset(packed.path))


BUILDERS = {"sharded": _sharded, "file": _single}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_pinned_version_in_the_cache_is_read_with_no_request(
    kind: str,
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    url = f"s3://{s3_bucket}/sets/photos"
    sha, truth = BUILDERS[kind](tmp_path, url, s3_storage_options)
    cache = tmp_path / "cache"
    first = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    assert first.version == sha
    assert _all(first) == truth  # the first job: every byte read from the server, then kept
    first.close()

    s3_requests.clear()
    pinned = H5ImageDataset(url, storage_options=s3_storage_options, version=sha, cache_dir=cache)
    assert pinned.version == sha
    assert _all(pinned) == truth
    assert epoch(pinned, "spawn") == truth  # workers open it from the cache too
    assert s3_requests() == []

    # Unpinned, the same job asks for the pointer (a name may move to another version) and
    # nothing else: the version it names is the one the cache holds by its sha256.
    latest = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    assert _all(latest) == truth
    asked = s3_requests()
    assert [r.method for r in asked] == ["GET"]
    assert asked[0].path.split("?")[0].endswith("/photos.latest.json")


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("damage", ["flipped", "link"])
def test_cached_bytes_that_are_not_the_version_are_never_served(
    kind: str,
    damage: str,
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    url = f"s3://{s3_bucket}/sets/photos"
    sha, truth = BUILDERS[kind](tmp_path, url, s3_storage_options)
    cache = tmp_path / "cache"
    _all(H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache))
    name = "version.json" if kind == "sharded" else "asset.h5"
    (kept,) = cache.glob(f"*/{name}")
    good = kept.read_bytes()
    if damage == "flipped":
        data = bytearray(good)
        data[len(data) // 2] ^= 0x01
        kept.write_bytes(bytes(data))
    else:  # another file with the right bytes, linked in: never followed
        real = tmp_path / "elsewhere"
        real.write_bytes(good)
        kept.unlink()
        os.symlink(real, kept)

    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options, version=sha, cache_dir=cache)
    assert _all(ds) == truth
    # The cache did not vouch for what it holds: the version was read from the server again.
    assert any(
        r.path.split("?")[0].endswith(".h5" if kind == "file" else ".version.json")
        for r in s3_requests()
    )
    assert kept.read_bytes() == good
    assert not kept.is_symlink()


def test_a_pinned_version_the_server_has_removed_is_still_read_from_the_cache(
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    # The documented trade of a pinned open: it asks nothing, so it does not see retention
    # remove the version; what it reads is still exactly the version its sha256 names.
    url = f"s3://{s3_bucket}/sets/photos"
    sha, truth = _sharded(tmp_path, url, s3_storage_options)
    cache = tmp_path / "cache"
    _all(H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache))
    Location(url, s3_storage_options).fs.rm(f"{s3_bucket}/sets", recursive=True)
    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options, version=sha, cache_dir=cache)
    assert _all(ds) == truth
    assert s3_requests() == []
    with pytest.raises(FileNotFoundError):  # not pinned: the pointer is gone, and says so
        H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
