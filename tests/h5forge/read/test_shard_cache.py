"""``cache_dir=`` over a sharded version: shards cached by content address (sha256 + size).

Sharded versions built by the writer (:func:`h5forge.publish.shard_release.build_sharded_version`)
on an S3-protocol server on loopback (moto), read with one ``cache_dir`` through two versions and
through two bases; downloads counted at the server (GETs of ``shards/<sha256>.h5``) and by the
cache's entries; a server answering with other bytes than the manifest names is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.files import is_ours
from h5forge.location import Location
from h5forge.locks import lock_file
from h5forge.publish.manifest import VersionManifest, read_manifest, shard_key
from h5forge.publish.shard_release import build_sharded_version
from h5forge.read.block_cache import ENTRY_KIND
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.remote_epoch import WORKERS, content, epoch
from tests.fixtures.servers import S3RequestLog

SMALL = 2**20  # the smallest shard size: 6 samples of 224 x 224 x 3 each: 5 shards of 30


def _source(root: Path) -> Path:
    write_image_folder(root, classes=("cat", "dog"), per_class=15, size=(60, 80))
    return root


def _build(source: Path, asset: Location) -> Any:
    return build_sharded_version(source, asset, max_shard_size=SMALL, workers=1)


def _shard_gets(log: S3RequestLog) -> Counter[str]:
    """GETs of shard bytes, per shard file name."""
    return Counter(
        r.path.split("?")[0].rsplit("/", 1)[1]
        for r in log()
        if r.method == "GET" and "/shards/" in r.path and r.path.split("?")[0].endswith(".h5")
    )


def _entries(cache: Path) -> list[Path]:
    """The cache's whole-file entries (marked folders holding a copy)."""
    return sorted(p for p in cache.iterdir() if p.is_dir() and (p / "asset.h5").exists())


def _kept(cache: Path) -> list[Path]:
    """Every file in the cache but lock files and the version's manifest (kept by its sha256,
    which it hashes to, whatever a shard holds): what a refused download must not leave."""
    manifests = {p.parent for p in cache.glob("*/version.json")}
    return sorted(
        p
        for p in cache.rglob("*")
        if p.is_file() and not p.name.endswith(".lock") and p.parent not in manifests
    )


def _manifest(base: Path) -> VersionManifest:
    """The manifest of the one version at the local ``base``."""
    (path,) = base.glob("v/*/*.version.json")
    return read_manifest(Location(str(path)))


def _samples(ds: H5ImageDataset) -> Counter[tuple[str, int]]:
    return content(ds[i] for i in range(len(ds)))


@pytest.fixture(scope="module")
def local_asset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A sharded version built locally (``store/photos``, 5 shards) and its sha256: uploaded
    as is to each test's bucket, under as many bases as the test needs."""
    tmp = tmp_path_factory.mktemp("shard_cache")
    base = tmp / "store" / "photos"
    result = _build(_source(tmp / "src"), Location(str(base)))
    assert result.shards == 5
    return base, result.sha256


def _upload(base: Path, url: str, storage_options: dict[str, Any]) -> str:
    """The asset at the local ``base`` (shards, manifests, pointer) copied to ``url``."""
    fs = Location(url, storage_options).fs
    dest = url.removeprefix("s3://")
    fs.put(str(base), dest, recursive=True)
    fs.put(f"{base}.latest.json", f"{dest}.latest.json")
    return url


def test_versions_sharing_shards_fill_each_once(
    tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any], s3_requests: S3RequestLog
) -> None:
    source = _source(tmp_path / "src")
    url = f"s3://{s3_bucket}/sets/photos"
    asset = Location(url, s3_storage_options)
    first = _build(source, asset)
    (source / "cat" / sorted(os.listdir(source / "cat"))[0]).unlink()
    write_image_folder(tmp_path / "more", classes=("dog",), per_class=3, size=(60, 80), seed=9)
    for f in (tmp_path / "more" / "dog").iterdir():
        shutil.move(f, source / "dog" / f"new-{f.name}")
    second = _build(source, asset)
    assert 0 < second.shards_new < second.shards  # the versions share shards, not all
    cache = tmp_path / "cache"

    def read(version: str, cache_dir: Path | None) -> Counter[tuple[str, int]]:
        ds = H5ImageDataset(
            url, storage_options=s3_storage_options, version=version, cache_dir=cache_dir
        )
        return _samples(ds)

    truth = {v: read(v, None) for v in (first.sha256, second.sha256)}  # read remotely
    s3_requests.clear()
    assert read(first.sha256, cache) == truth[first.sha256]
    # Read from the server (ranges, no whole-shard download before the first sample), and
    # every shard's entry filled from those reads: complete, one per shard.
    assert len(_shard_gets(s3_requests)) == first.shards
    assert len(_entries(cache)) == first.shards
    assert not list(cache.glob("*/fill.h5"))
    assert not list(cache.glob("*/*.have"))
    held = set(_entries(cache))

    s3_requests.clear()
    assert read(second.sha256, cache) == truth[second.sha256]
    # Only the shards the first version does not have are read from the server; the shared
    # ones are the same entries, complete already.
    assert len(_shard_gets(s3_requests)) == second.shards_new
    assert len(_entries(cache)) == first.shards + second.shards_new
    assert held < set(_entries(cache))

    s3_requests.clear()
    assert read(first.sha256, cache) == truth[first.sha256]
    assert read(second.sha256, cache) == truth[second.sha256]
    # Reading them again asks nothing about any shard: not its bytes, not even its size.
    assert [r for r in s3_requests() if "/shards/" in r.path] == []


@pytest.mark.slow
def test_a_shard_under_two_bases_is_one_entry_and_workers_ask_nothing(
    local_asset: tuple[Path, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    base, sha = local_asset
    a = _upload(base, f"s3://{s3_bucket}/team-a/photos", s3_storage_options)
    b = _upload(base, f"s3://{s3_bucket}/copies/team-b/photos", s3_storage_options)
    truth = _samples(H5ImageDataset(str(base)))
    cache = tmp_path / "cache"
    shards = len(_manifest(base).shards)

    s3_requests.clear()
    first = H5ImageDataset(a, storage_options=s3_storage_options, cache_dir=cache)
    assert first.version == sha
    assert epoch(first, "spawn") == truth  # two DataLoader workers fill the cache
    assert len(_shard_gets(s3_requests)) == shards
    # The epoch read every sample: each shard's entry is complete, its copy the shard.
    assert len(_entries(cache)) == shards
    held = {hashlib.sha256((e / "asset.h5").read_bytes()).hexdigest() for e in _entries(cache)}
    assert held == {s.sha256 for s in _manifest(base).shards}

    second = H5ImageDataset(b, storage_options=s3_storage_options, cache_dir=cache)
    assert second.version == sha
    s3_requests.clear()  # opening read the pointer and the version manifest (no shard)
    assert epoch(second, "spawn") == truth
    assert len(_entries(cache)) == shards  # the same entries: the key has no URL in it
    # The workers opened every shard from the cache without asking the server anything about
    # it. (Each worker reads the version manifest again, once, when it first needs it: that
    # is the dataset's open, not the cache's.)
    asked = s3_requests()
    assert all(r.method == "GET" and r.path.endswith("/photos.version.json") for r in asked), asked
    assert len(asked) <= WORKERS


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_server_serving_other_bytes_is_refused_and_nothing_kept(
    damage: str,
    local_asset: tuple[Path, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
) -> None:
    base, _ = local_asset
    url = _upload(base, f"s3://{s3_bucket}/photos", s3_storage_options)
    entry = _manifest(base).shards[0]
    good = (base / shard_key(entry.sha256)).read_bytes()
    bad = bytearray(good)
    if damage == "flipped":
        bad[len(bad) // 2] ^= 0xFF  # same size: only the hash can tell
    else:
        del bad[-100:]
    fs = Location(url, s3_storage_options).fs
    target = f"{s3_bucket}/photos/{shard_key(entry.sha256)}"
    fs.pipe(target, bytes(bad))
    cache = tmp_path / "cache"
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    with pytest.raises(IntegrityError) as refused:
        _samples(ds)  # the first samples live in shard 0
    if damage == "flipped":  # same size: the hash of the whole shard, once filled, tells
        bad_sha = hashlib.sha256(bad).hexdigest()
        assert all(s in str(refused.value) for s in (entry.sha256, bad_sha, target)), refused
        assert "manifest" in str(refused.value)
    else:  # shorter than the HDF5 file it holds: refused when opened
        assert "truncated" in str(refused.value)
    assert _kept(cache) == []  # no copy, no temp file, no empty entry folder left behind
    # The server serves the right bytes again: the same cache downloads and serves them.
    fs.pipe(target, good)
    again = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    assert _samples(again) == _samples(H5ImageDataset(str(base)))
    (kept,) = [e for e in _entries(cache) if (e / "asset.h5").read_bytes() == good]
    assert is_ours(str(kept), ENTRY_KIND)


def test_a_shard_larger_than_the_limit_keeps_its_blocks_per_url(
    local_asset: tuple[Path, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    base, _ = local_asset
    a = _upload(base, f"s3://{s3_bucket}/a/photos", s3_storage_options)
    b = _upload(base, f"s3://{s3_bucket}/b/photos", s3_storage_options)
    truth = _samples(H5ImageDataset(str(base)))
    cache, limit = tmp_path / "cache", 512 << 10  # every shard is about 1 MB
    for url in (a, b, a):
        ds = H5ImageDataset(
            url, storage_options=s3_storage_options, cache_dir=cache, cache_limit=limit
        )
        assert _samples(ds) == truth
    assert _entries(cache) == []  # no whole copy of a shard over the limit
    # Blocks cannot be checked against the shard's sha256 one by one, so they are kept under
    # the URL they came from (one folder per shard and base), never shared across bases.
    blocks = [p for p in cache.iterdir() if p.is_dir() and p.name.startswith("blocks-")]
    assert len(blocks) == 2 * len(_manifest(base).shards)
    assert not [r for r in s3_requests() if r.path.endswith(".h5.manifest.json")]  # no sidecar


def test_a_shard_over_the_limit_of_another_size_is_refused(
    local_asset: tuple[Path, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
) -> None:
    base, _ = local_asset
    url = _upload(base, f"s3://{s3_bucket}/photos", s3_storage_options)
    entry = _manifest(base).shards[0]
    good = (base / shard_key(entry.sha256)).read_bytes()
    Location(url, s3_storage_options).fs.pipe(
        f"{s3_bucket}/photos/{shard_key(entry.sha256)}", good[:-100]
    )
    ds = H5ImageDataset(
        url, storage_options=s3_storage_options, cache_dir=tmp_path / "c", cache_limit=512 << 10
    )
    with pytest.raises(IntegrityError, match=f"{entry.bytes - 100} bytes.*{entry.bytes}"):
        ds[0]


def test_a_copy_whose_record_is_being_written_is_waited_for_not_removed(
    local_asset: tuple[Path, str],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    """Two workers needing one shard: the second finds the first's copy renamed into place but
    its record not yet written (under the entry's lock). It waits for the lock and uses the
    copy; it never removes it (which made the shard download twice)."""
    base, _ = local_asset
    url = _upload(base, f"s3://{s3_bucket}/photos", s3_storage_options)
    cache = tmp_path / "cache"
    H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)[0]
    good = (base / shard_key(_manifest(base).shards[0].sha256)).read_bytes()
    (entry,) = [e for e in _entries(cache) if (e / "asset.h5").read_bytes() == good]
    record = (entry / "entry.json").read_bytes()
    inode = (entry / "asset.h5").stat().st_ino
    held, go = threading.Event(), threading.Event()

    def first_worker() -> None:
        with lock_file(f"{entry}.lock"):
            (entry / "entry.json").unlink()  # between its rename and its record
            held.set()
            go.wait(30)
            (entry / "entry.json").write_bytes(record)

    other = threading.Thread(target=first_worker)
    other.start()
    assert held.wait(30)
    threading.Timer(1.0, go.set).start()
    s3_requests.clear()
    second = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    image, _ = second[0]
    other.join(30)
    assert _shard_gets(s3_requests) == Counter()
    assert (entry / "asset.h5").stat().st_ino == inode
    assert content([(image, 0)]) == content([(H5ImageDataset(str(base))[0][0], 0)])
