"""Readers pin versions: ``H5ImageDataset(base, version=...)`` resolves the version once, in the
constructing process, and reads that version's file (never written over) from then on.

The acceptance test publishes version 2 of an asset mid-epoch (moto S3, 2 DataLoader workers
under spawn here and fork in a training process of its own) and checks that the epoch, and the
next one, are version 1 byte for byte, while a dataset opened afterwards reads version 2.

Request budget: ``version="latest"`` costs one GET of the pointer, in the constructing process
only, on top of the file's own 2 requests per opening process (tests/h5forge/read/test_remote.py).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import pytest

from h5forge.asset.metadata import metadata_sha256
from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.release import publish_version
from h5forge.publish.sidecar import sidecar_url
from h5forge.publish.storage import publish
from h5forge.publish.versions import pointer_url, version_url, write_pointer
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures import pinned_epoch
from tests.fixtures.pinned_epoch import epoch_across
from tests.fixtures.remote_epoch import WORKERS, content
from tests.fixtures.servers import S3RequestLog

NAME = "flowers"


def _pack(tmp: Path, seed: int) -> PackResult:
    root = tmp / "src"
    write_image_folder(root, classes=("a", "b", "c"), per_class=12, seed=seed, size=(20, 24))
    config = PackConfig(ImageConfig(resize="resize", size=(16, 20)))
    return pack(root, tmp / f"{NAME}.h5", config=config, workers=1)


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[PackResult, PackResult]:
    """Two versions of one asset (same NAME, same classes and count, different pixels)."""
    return (
        _pack(tmp_path_factory.mktemp("v1"), seed=1),
        _pack(tmp_path_factory.mktemp("v2"), seed=2),
    )


def _truth(path: str) -> Counter[tuple[str, int]]:
    ds = H5ImageDataset(path)
    return content(ds[i] for i in range(len(ds)))


def _publish(local: str, base: str, options: dict[str, Any] | None = None, parent: str = "") -> str:
    """Publish ``local`` as a version of ``base`` and move the pointer to it; its sha256."""
    sha = Location.of(local).sha256()
    result = publish(local, version_url(base, sha), storage_options=options)
    assert result.sha256 == sha
    write_pointer(Location(base, options), sha, parent=parent)
    return sha


def _pointer_gets(log: S3RequestLog) -> list[str]:
    return [r.path for r in log() if r.method == "GET" and r.path.endswith(f"/{NAME}.latest.json")]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_an_epoch_reads_the_version_it_was_opened_at(
    method: str,
    versions: tuple[PackResult, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    v1, v2 = versions
    base = f"s3://{s3_bucket}/assets/{NAME}"
    truth1, truth2 = _truth(v1.path), _truth(v2.path)
    assert truth1 != truth2  # same labels, different pixels
    sha1 = _publish(v1.path, base, s3_storage_options)
    sha2 = Location.of(v2.path).sha256()

    def publish_v2() -> None:  # mid-epoch: the first batch has arrived
        _publish(v2.path, base, s3_storage_options, parent=sha1)

    s3_requests.clear()
    if method == "spawn":
        ds = H5ImageDataset(base, version="latest", storage_options=s3_storage_options)
        assert (ds.url, ds.version) == (version_url(base, sha1), sha1)
        epochs = [epoch_across(ds, method, publish_v2), epoch_across(ds, method, lambda: None)]
    else:
        # Fork workers from a training process of its own (see tests/fixtures/remote_epoch.py).
        got = pinned_epoch.run(base, method, s3_storage_options, publish_v2)
        assert (got.url, got.version) == (version_url(base, sha1), sha1)
        epochs = got.epochs
    # Version 1 byte for byte, in the epoch the publish happened in and in the next one, whose
    # workers started after the pointer had moved.
    assert epochs == [truth1, truth1]
    assert _pointer_gets(s3_requests) == [f"/{s3_bucket}/assets/{NAME}.latest.json"]

    after = H5ImageDataset(base, version="latest", storage_options=s3_storage_options)
    assert (after.url, after.version) == (version_url(base, sha2), sha2)
    assert content(after[i] for i in range(len(after))) == truth2
    assert len(_pointer_gets(s3_requests)) == 2


def test_latest_costs_one_pointer_read_in_the_main_process_only(
    versions: tuple[PackResult, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    v1, _ = versions
    base = f"s3://{s3_bucket}/{NAME}"
    sha1 = _publish(v1.path, base, s3_storage_options)
    file_path = f"/{s3_bucket}/{NAME}/v/{sha1[:16]}/{NAME}.h5"

    s3_requests.clear()
    # Uncached: the default cache also asks for the sidecar (test_fill.py counts that path).
    ds = H5ImageDataset(base, version="latest", storage_options=s3_storage_options, cache_dir=False)
    opened = [(r.method, r.path, (r.range or "")[:8]) for r in s3_requests()]
    assert opened == [
        ("GET", f"/{s3_bucket}/{NAME}.latest.json", "bytes=0-"),  # one bounded read
        ("HEAD", file_path, ""),
        ("GET", file_path, "bytes=0-"),
    ]

    s3_requests.clear()
    assert epoch_across(ds, "spawn", lambda: None) == _truth(v1.path)
    seen = s3_requests()
    assert {r.path for r in seen} == {file_path}, seen  # no pointer read in any worker
    assert sum(r.method == "HEAD" for r in seen) == WORKERS


def test_a_version_by_prefix(
    versions: tuple[PackResult, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    v1, v2 = versions
    base = f"s3://{s3_bucket}/{NAME}"
    sha1 = _publish(v1.path, base, s3_storage_options)
    _publish(v2.path, base, s3_storage_options, parent=sha1)  # latest is v2 now
    truth1 = _truth(v1.path)
    for url, prefix in [(base, sha1[:16]), (f"{base}.h5", sha1[:40]), (base + "/", sha1)]:
        s3_requests.clear()
        ds = H5ImageDataset(url, version=prefix, storage_options=s3_storage_options)
        assert (ds.url, ds.version) == (version_url(base, sha1), sha1)
        assert content(ds[i] for i in range(len(ds))) == truth1
        assert not _pointer_gets(s3_requests)
        clone = pickle.loads(pickle.dumps(ds))
        assert (clone.url, clone.version) == (ds.url, ds.version)


@pytest.mark.parametrize(
    "tail", [lambda sha: "0" * 16, lambda sha: sha[:16] + ("0" if sha[16] != "0" else "1")]
)
def test_an_unknown_prefix_is_not_found(
    tail: Any, versions: tuple[PackResult, PackResult], tmp_path: Path
) -> None:
    base = str(tmp_path / NAME)
    sha1 = _publish(versions[0].path, base)
    with pytest.raises(FileNotFoundError, match="no version"):
        H5ImageDataset(base, version=tail(sha1))


def test_no_pointer_is_a_clear_error(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    with pytest.raises(FileNotFoundError, match=r"flowers\.latest\.json.*no published version"):
        H5ImageDataset(
            f"s3://{s3_bucket}/{NAME}", version="latest", storage_options=s3_storage_options
        )


@pytest.mark.parametrize("bad", ["LATEST", "abc123", "0" * 15, "g" * 16, 16, b"latest"])
def test_a_bad_version_is_refused_before_any_read(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="version"):
        H5ImageDataset(str(tmp_path / NAME), version=bad)


def test_the_name_an_asset_was_published_to_reads_its_latest_version(
    versions: tuple[PackResult, PackResult],
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
) -> None:
    # Names round-trip: DEST.h5 (no file of that name) and its base DEST both read the
    # latest version, pinned as version="latest" pins it.
    local = str(tmp_path / NAME)
    sha = _publish(versions[0].path, local)
    s3 = f"s3://{s3_bucket}/{NAME}"
    _publish(versions[0].path, s3, s3_storage_options)
    for base, options in [(local, None), (s3, s3_storage_options)]:
        for name in (base, base + ".h5"):
            ds = H5ImageDataset(name, storage_options=options)
            assert (ds.url, ds.version) == (version_url(base, sha), sha), name
            assert len(ds) == len(H5ImageDataset(versions[0].path))
    with pytest.raises(FileNotFoundError) as missing:  # neither a file nor a version
        H5ImageDataset(str(tmp_path / "other.h5"))
    assert "no published version of that asset" in str(missing.value)
    assert f"{tmp_path / 'other'}.latest.json" in str(missing.value)


def test_a_pickled_dataset_keeps_its_version_after_the_pointer_moved(
    versions: tuple[PackResult, PackResult], tmp_path: Path
) -> None:
    v1, v2 = versions
    base = str(tmp_path / "store" / NAME)
    sha1 = _publish(v1.path, base)
    ds = H5ImageDataset(base, version="latest")
    blob = pickle.dumps(ds)
    sha2 = _publish(v2.path, base, parent=sha1)
    assert json.loads(Path(pointer_url(base)).read_text())["sha256"] == sha2
    clone = pickle.loads(blob)
    assert (clone.url, clone.version) == (version_url(base, sha1), sha1)
    assert content(clone[i] for i in range(len(clone))) == _truth(v1.path)
    plain = H5ImageDataset(v1.path)
    assert (plain.url, plain.version) == (os.fspath(v1.path), "")


def test_a_sidecar_outside_its_version_key_is_refused(
    versions: tuple[PackResult, PackResult], tmp_path: Path
) -> None:
    v1, v2 = versions
    base = str(tmp_path / NAME)
    sha1 = _publish(v1.path, base)
    sidecar = Path(sidecar_url(version_url(base, sha1)))
    fields = json.loads(sidecar.read_text())
    fields["sha256"] = Location.of(v2.path).sha256()  # untrusted: names another version's digest
    sidecar.write_text(json.dumps(fields))
    with pytest.raises(IntegrityError, match="sidecar names sha256"):
        H5ImageDataset(base, version=sha1[:16])


def test_a_local_version_whose_file_was_replaced_is_refused(
    versions: tuple[PackResult, PackResult], tmp_path: Path
) -> None:
    base = str(tmp_path / "store" / NAME)
    first = publish_version(versions[0].path, Location(base))
    assert H5ImageDataset(base, version="latest").version == first.sha256
    # Another valid asset of the same name, shape and size, copied over the version's file:
    # before, it was read under version 1's sha256.
    assert os.path.getsize(versions[1].path) == os.path.getsize(first.url)
    shutil.copyfile(versions[1].path, first.url)
    for version in ("latest", first.sha256, first.version):
        with pytest.raises(IntegrityError, match="is not the file version .* it was replaced"):
            H5ImageDataset(base, version=version)
    # A file of another size is refused by its size alone (what a sidecar without a metadata
    # digest, written before the check, still gets).
    with open(first.url, "ab") as f:
        f.write(b"\0")
    with pytest.raises(IntegrityError, match=r"it is \d+ bytes, the sidecar says \d+"):
        H5ImageDataset(base, version="latest")
    # The file as published reads again.
    shutil.copyfile(versions[0].path, first.url)
    assert len(H5ImageDataset(base, version="latest")) == 36


def test_a_version_sidecar_records_the_metadata_digest_a_reader_recomputes(
    versions: tuple[PackResult, PackResult], tmp_path: Path
) -> None:
    base = str(tmp_path / "store" / NAME)
    first = publish_version(versions[0].path, Location(base))
    recorded = json.loads(Path(sidecar_url(first.url)).read_text())["metadata_sha256"]
    with h5py.File(versions[0].path, "r") as h5:
        assert recorded == h5.attrs["metadata_sha256"]
    # An attacker edits a label in place and reseals the attribute: same size, a file that
    # verifies on its own, but not the version published.
    with h5py.File(first.url, "r+") as h5:
        h5["labels"][0] = (int(h5["labels"][0]) + 1) % 3
        h5.attrs["metadata_sha256"] = metadata_sha256(h5)
    with pytest.raises(IntegrityError, match="index and attributes hash to [0-9a-f]{64}"):
        H5ImageDataset(base, version=first.sha256)
