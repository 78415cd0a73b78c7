"""Sharded versions, the writer: what a version holds, what a new version writes, and refusals.

Every version is compared with a full single-file pack of the same source, sample by sample
(path, class name, split, sha256 of the stored pixels), read from the shards' own datasets
through the manifest's deletion vectors and class maps.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import h5py
import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.errors import BusyError, IntegrityError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.publish.manifest import VersionManifest, manifest_bytes, read_manifest, shard_key
from h5forge.publish.shard_release import build_sharded_version, publish_sharded, upload_shard
from h5forge.publish.sharded import pack_sharded, read_previous
from h5forge.publish.versions import asset_base, read_pointer

SMALL = 2**20  # the smallest shard size: 6 samples of 224 x 224 x 3 each
Row = tuple[str, str, str]  # class name, split, sha256 of the stored bytes


def _texts(values: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _file_rows(h5: h5py.File, rows: list[int], names: list[str]) -> dict[str, Row]:
    paths = _texts(h5["paths"][:])
    labels, splits = h5["labels"][:], h5["splits"][:]
    split_names = _texts(h5["split_names"][:])
    return {
        paths[r]: (
            names[int(labels[r])],
            split_names[int(splits[r])],
            h5["digests"][r].tobytes().hex(),
        )
        for r in rows
    }


def version_rows(asset: Location) -> tuple[dict[str, Row], VersionManifest]:
    """Every live sample of the asset's latest (sharded) version, by path, on any store."""
    pointer = read_pointer(asset)
    assert pointer is not None
    assert pointer.kind == "sharded"
    manifest = read_manifest(asset.with_url(pointer.url), pointer.sha256)
    base = asset_base(asset.url)
    found: dict[str, Row] = {}
    for entry in manifest.shards:
        shard = asset.with_url(manifest.shard_url(base, entry))
        data = shard.fs.cat_file(shard.path)
        assert hashlib.sha256(data).hexdigest() == entry.sha256
        with h5py.File(io.BytesIO(data), "r") as h5:
            own = _texts(h5["classes"][:])
            names = [manifest.classes[v] if v >= 0 else "" for v in entry.labels]
            assert len(names) == len(own)
            assert all(n in ("", o) for n, o in zip(names, own, strict=True))
            rows = _file_rows(h5, entry.live_rows().tolist(), names)
        assert not rows.keys() & found.keys(), "a sample is live in two shards"
        found.update(rows)
    assert len(found) == manifest.num_samples
    assert "" not in {name for name, _, _ in found.values()}
    return found, manifest


def full_rows(source: Path, tmp: Path) -> dict[str, Row]:
    """The same source packed into one file, by path."""
    out = tmp / f"full-{len(list(tmp.glob('full-*')))}.h5"
    pack(source, out, workers=1)
    with h5py.File(out, "r") as h5:
        return _file_rows(h5, list(range(h5["labels"].shape[0])), _texts(h5["classes"][:]))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_image_folder(src, classes=("cat", "dog"), per_class=15, size=(60, 80))
    return src


def _build(source: Path, asset: Location, **kwargs: Any) -> Any:
    return build_sharded_version(source, asset, max_shard_size=SMALL, workers=1, **kwargs)


def test_a_sharded_version_reads_as_a_full_pack_of_each_source(
    source: Path, tmp_path: Path
) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    first = _build(source, asset)
    assert first.shards == 5
    assert first.shards_new == 5
    assert first.num_samples == 30
    rows, manifest = version_rows(asset)
    assert rows == full_rows(source, tmp_path)
    assert manifest.classes == ("cat", "dog")

    # a removed file, a replaced file (other pixels, same name), a new class
    cats = sorted((source / "cat").iterdir())
    cats[0].unlink()
    shutil.copyfile(sorted((source / "dog").iterdir())[3], cats[7])
    write_image_folder(tmp_path / "more", classes=("bird",), per_class=4, size=(60, 80), seed=7)
    shutil.move(tmp_path / "more" / "bird", source / "bird")
    second = _build(source, asset)
    assert second.parent == first.sha256
    rows, manifest = version_rows(asset)
    assert rows == full_rows(source, tmp_path)
    assert manifest.classes == ("bird", "cat", "dog")
    # old shards keep their own class lists; the manifest maps them by name
    old = [e for e in manifest.shards if e.sha256 not in set(_new_shards(second, asset))]
    assert old
    assert all(e.labels == (1, 2) for e in old)
    assert sum(len(e.deleted) for e in manifest.shards) == 2  # the removed and the replaced


def _new_shards(result: Any, asset: Location) -> set[str]:
    manifest = read_manifest(asset.with_url(read_pointer(asset).url), result.sha256)
    return {e.sha256 for e in manifest.shards[result.shards_reused :]}


def test_a_new_version_writes_only_the_changed_samples_shards(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    first = _build(source, asset)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "store/photos/shards").iterdir()}
    write_image_folder(tmp_path / "more", classes=("dog",), per_class=2, size=(60, 80), seed=9)
    for f in (tmp_path / "more" / "dog").iterdir():
        shutil.move(f, source / "dog" / f"new-{f.name}")
    second = _build(source, asset)
    assert (second.shards_new, second.shards_reused) == (1, first.shards)
    assert second.bytes_new < first.bytes_new / 4
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "store/photos/shards").iterdir()}
    assert {k: after[k] for k in before} == before  # no shard written over
    assert len(after) == len(before) + 1


def test_an_unchanged_source_publishes_nothing(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    _build(source, asset)
    listing = sorted(str(p) for p in (tmp_path / "store").rglob("*"))
    pointer = (tmp_path / "store" / "photos.latest.json").read_bytes()
    assert _build(source, asset) is None
    assert sorted(str(p) for p in (tmp_path / "store").rglob("*")) == listing
    assert (tmp_path / "store" / "photos.latest.json").read_bytes() == pointer


def test_the_same_samples_give_the_same_shard_addresses(source: Path, tmp_path: Path) -> None:
    one, two = Location(str(tmp_path / "a" / "x")), Location(str(tmp_path / "b" / "y"))
    _build(source, one)
    build_sharded_version(source, two, max_shard_size=SMALL, workers=2)  # other worker count
    assert sorted(os.listdir(tmp_path / "a/x/shards")) == sorted(
        os.listdir(tmp_path / "b/y/shards")
    )


def test_a_shard_left_mostly_dead_is_rewritten(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    _build(source, asset)
    _, manifest = version_rows(asset)
    first = Path(asset.path) / shard_key(manifest.shards[0].sha256)
    with h5py.File(first, "r") as h5:
        doomed = _texts(h5["paths"][:])[:4]  # 4 of its 6 samples
    for rel in doomed:
        (source / rel).unlink()
    second = _build(source, asset)
    rows, manifest = version_rows(asset)
    assert all(e.sha256 != first.stem for e in manifest.shards)  # compacted away
    assert all(not e.deleted for e in manifest.shards)
    assert rows == full_rows(source, tmp_path)
    assert second.shards_new >= 1


def test_a_publish_is_refused_when_another_published_since_it_began(
    source: Path, tmp_path: Path
) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    first = _build(source, asset)
    previous = read_previous(asset, read_pointer(asset))
    (source / "cat" / sorted(os.listdir(source / "cat"))[0]).unlink()
    staged = pack_sharded(
        discover(source), tmp_path / "work", config=PackConfig(), max_shard_size=SMALL,
        workers=1, previous=previous, unchanged=frozenset(), name="photos",
    )  # fmt: skip
    (source / "dog" / sorted(os.listdir(source / "dog"))[0]).unlink()
    second = _build(source, asset)  # another build, published meanwhile
    with pytest.raises(BusyError, match="moved to version"):
        publish_sharded(staged, asset, based_on=first.sha256)
    assert read_pointer(asset).sha256 == second.sha256


@pytest.mark.parametrize("replaced", ["shard", "manifest"])
def test_nothing_is_reused_from_a_latest_version_that_was_replaced(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, replaced: str
) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    first = _build(source, asset)
    _, manifest = version_rows(asset)
    if replaced == "shard":
        # Another valid shard of as many samples (other pixels, the same names) at its address.
        other = tmp_path / "other"
        write_image_folder(other, classes=("cat", "dog"), per_class=15, size=(60, 80), seed=3)
        _build(other, Location(str(tmp_path / "elsewhere" / "photos")))
        theirs = sorted((tmp_path / "elsewhere/photos/shards").iterdir())
        ours = Path(asset.path) / shard_key(manifest.shards[0].sha256)
        same = [t for t in theirs if t.stat().st_size == ours.stat().st_size]
        swap = (same or theirs)[0]  # of the same size where one is: the metadata tells
        ours.write_bytes(swap.read_bytes())
    else:
        where = tmp_path / "store/photos/v" / first.version / "photos.version.json"
        body = json.loads(where.read_bytes())
        body["created_at"] = "2000-01-01T00:00:00+00:00"
        where.write_bytes(json.dumps(body).encode())
    assert read_previous(asset, read_pointer(asset)) is None
    assert "nothing is reused" in caplog.text
    (source / "cat" / sorted(os.listdir(source / "cat"))[0]).unlink()
    second = _build(source, asset)
    assert (second.shards_reused, second.shards_new) == (0, second.shards)  # a full build
    rows, _ = version_rows(asset)
    assert rows == full_rows(source, tmp_path)


def test_a_local_shard_is_linked_into_the_store_and_a_name_taken_is_written_anew(
    tmp_path: Path,
) -> None:
    local = tmp_path / "work" / "shard.h5"
    local.parent.mkdir()
    local.write_bytes(os.urandom(5000))
    sha = hashlib.sha256(local.read_bytes()).hexdigest()
    home = Location(str(tmp_path / "store" / "photos"))
    assert upload_shard(home, sha, str(local)) == 5000
    stored = Path(home.path) / shard_key(sha)
    assert os.path.samestat(stored.stat(), local.stat())  # one inode: written once
    local.unlink()  # the build removes its staged shards: the stored one stays
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha
    # A name already taken (say, by a shard retention is deleting, or other bytes): written
    # anew over it from the local file, and read back.
    again = tmp_path / "work" / "again.h5"
    again.write_bytes(stored.read_bytes())
    stored.unlink()
    stored.write_bytes(b"not the shard")
    assert upload_shard(home, sha, str(again)) == 5000
    assert not os.path.samestat(stored.stat(), again.stat())
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha


def test_a_tampered_manifest_is_refused(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    result = _build(source, asset)
    where = Path(tmp_path / "store/photos/v" / result.version / "photos.version.json")
    body = json.loads(where.read_bytes())
    body["shards"][0]["deleted"] = [0]
    where.write_bytes(json.dumps(body).encode())
    with pytest.raises(IntegrityError, match="hashes to"):
        read_manifest(Location(str(where)), result.sha256)
    with pytest.raises(ValueError, match="num_samples"):
        read_manifest(Location(str(where)))
    body["num_samples"] -= 1
    body["shards"][0]["deleted"] = [9]
    where.write_bytes(json.dumps(body).encode())
    with pytest.raises(ValueError, match=r"shards\[0\]\.deleted"):
        read_manifest(Location(str(where)))


def test_manifest_bytes_round_trip(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos"))
    result = _build(source, asset)
    _, manifest = version_rows(asset)
    data = manifest_bytes(manifest)
    assert hashlib.sha256(data).hexdigest() == result.sha256


def test_a_sharded_version_on_s3_uploads_only_new_shards(
    source: Path,
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: Any,
) -> None:
    asset = Location(f"s3://{s3_bucket}/photos", s3_storage_options)
    first = _build(source, asset)
    assert first.shards_new == first.shards == 5
    (source / "cat" / sorted(os.listdir(source / "cat"))[0]).unlink()
    s3_requests.clear()
    second = _build(source, asset)
    assert second.shards_reused == 5
    assert second.shards_new == 0
    puts = [r for r in s3_requests() if r.method == "PUT"]
    assert not [r for r in puts if "/shards/" in r.path]  # only the manifest, map and pointer
    assert {r.path.rsplit("/", 1)[-1] for r in puts} >= {
        "photos.version.json",
        "photos.latest.json",
    }


def test_purge_removes_a_samples_bytes_from_every_version(source: Path, tmp_path: Path) -> None:
    from h5forge.publish.rewrite import purge

    asset = Location(str(tmp_path / "store" / "photos"))
    _build(source, asset)
    doomed = "cat/" + sorted(os.listdir(source / "cat"))[2]
    write_image_folder(tmp_path / "more", classes=("dog",), per_class=2, size=(60, 80), seed=9)
    for f in (tmp_path / "more" / "dog").iterdir():
        shutil.move(f, source / "dog" / f"new-{f.name}")
    (source / doomed).unlink()  # removed from the source: the older version still holds it
    _build(source, asset)
    found_before = _files_holding(tmp_path / "store", doomed)
    assert len(found_before) == 1  # one shard, shared by both versions
    result = purge(asset, [doomed])
    assert result.removed_samples == 1
    assert len(result.versions) == 2  # both versions written anew
    assert not _files_holding(tmp_path / "store", doomed)
    rows, manifest = version_rows(asset)
    assert doomed not in rows
    assert rows == full_rows(source, tmp_path)  # the latest still reads as its source
    assert manifest.parent == result.versions[0][1]
    # every version left is readable, and none names a shard that is gone
    for folder in (tmp_path / "store/photos/v").iterdir():
        m = read_manifest(Location(str(next(folder.glob("*.version.json")))))
        for e in m.shards:
            assert (tmp_path / "store/photos" / shard_key(e.sha256)).exists()
    # the next build is still incremental: nothing to do
    assert _build(source, asset) is None


def _files_holding(store: Path, path: str) -> list[Path]:
    """The shard files whose /paths list ``path``."""
    held = []
    for shard in (store / "photos" / "shards").iterdir():
        with h5py.File(shard, "r") as h5:
            if path in _texts(h5["paths"][:]):
                held.append(shard)
    return held


def test_compact_rewrites_mostly_dead_shards_with_their_live_rows(
    source: Path, tmp_path: Path
) -> None:
    from h5forge.publish.rewrite import compact

    asset = Location(str(tmp_path / "store" / "photos"))
    _build(source, asset)
    _, manifest = version_rows(asset)
    first = Path(asset.path) / shard_key(manifest.shards[0].sha256)
    with h5py.File(first, "r") as h5:
        doomed = _texts(h5["paths"][:])[:2]  # 2 of 6: the shard is kept, 4/6 live
    for rel in doomed:
        (source / rel).unlink()
    _build(source, asset)
    before, manifest = version_rows(asset)
    assert manifest.shards[0].deleted == (0, 1)
    assert compact(asset, below=0.5).versions == ()  # 4/6 live: nothing to do
    result = compact(asset, below=0.9)
    assert len(result.shards_rewritten) == 1
    after, compacted = version_rows(asset)
    assert after == before  # the same samples, digests and all
    assert list(after) == list(before)  # in the same order
    assert compacted.shards[0].deleted == ()
    assert compacted.shards[0].samples == 4
    assert compacted.parent == manifest_sha(manifest)
    assert _build(source, asset) is None  # still recognised as built from this source


def manifest_sha(manifest: VersionManifest) -> str:
    return hashlib.sha256(manifest_bytes(manifest)).hexdigest()


def test_purge_and_compact_from_the_command_line(source: Path, tmp_path: Path) -> None:
    from tests.h5forge.cli.test_cli import _cli, _error_line

    base = tmp_path / "store" / "photos"
    _build(source, Location(str(base)))
    doomed = "dog/" + sorted(os.listdir(source / "dog"))[0]
    done = _cli("purge", str(base), "--path", doomed)
    assert done.returncode == 0, done.stderr
    assert "1 rows removed from 1 shards; 1 versions written anew" in done.stdout
    assert doomed not in version_rows(Location(str(base)))[0]
    done = _cli("compact", str(base))
    assert done.returncode == 0, done.stderr
    assert "nothing written" in done.stdout
    missing = _cli("purge", str(tmp_path / "nowhere"), "--path", doomed)
    assert missing.returncode == 2
    assert "has no sharded version" in _error_line(missing)
    assert not (tmp_path / "nowhere").exists()  # nothing made for a name that is not there


def test_the_pointer_moves_only_if_no_other_host_moved_it_on_s3(
    source: Path, tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    from h5forge.publish.versions import guard_pointer, write_pointer

    asset = Location(f"s3://{s3_bucket}/photos", s3_storage_options)
    first = _build(source, asset)
    guard = guard_pointer(asset)
    assert guard.conditional
    assert guard.pointer is not None
    assert guard.pointer.sha256 == first.sha256
    other = "ab" * 32
    write_pointer(asset, other, parent=first.sha256, kind="sharded")  # another host's publish
    with pytest.raises(BusyError, match="moved by another writer"):
        write_pointer(asset, "cd" * 32, parent=first.sha256, kind="sharded", guard=guard)
    assert read_pointer(asset).sha256 == other  # left as the other writer made it
    # an asset with no pointer: only one of two first publishes may create it
    empty = Location(f"s3://{s3_bucket}/fresh", s3_storage_options)
    guards = [guard_pointer(empty), guard_pointer(empty)]
    write_pointer(empty, other, kind="sharded", guard=guards[0])
    with pytest.raises(BusyError):
        write_pointer(empty, "cd" * 32, kind="sharded", guard=guards[1])


def test_two_publishes_racing_on_s3_publish_one_version(
    source: Path, tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    import threading

    asset = Location(f"s3://{s3_bucket}/photos", s3_storage_options)
    first = _build(source, asset)
    previous = read_previous(asset, read_pointer(asset))
    staged = []
    for k in range(2):  # two builds of different sources, both based on the first version
        copy = tmp_path / f"copy-{k}"
        shutil.copytree(source, copy)
        (copy / "cat" / sorted(os.listdir(copy / "cat"))[k]).unlink()
        staged.append(
            pack_sharded(
                discover(copy),
                tmp_path / f"work-{k}",
                config=PackConfig(),
                max_shard_size=SMALL,
                workers=1,
                previous=previous,
                unchanged=frozenset(),
                name="photos",
            )  # fmt: skip
        )
    outcomes: list[object] = [None, None]
    start = threading.Barrier(2)

    def publish(k: int) -> None:
        start.wait()
        try:
            outcomes[k] = publish_sharded(staged[k], asset, based_on=first.sha256)
        except BusyError as e:
            outcomes[k] = e

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [o for o in outcomes if not isinstance(o, BusyError)]
    assert len(won) == 1, outcomes
    assert read_pointer(asset).sha256 == won[0].sha256  # type: ignore[attr-defined]
    assert won[0].parent == first.sha256  # type: ignore[attr-defined]


def test_a_built_sharded_version_reads_through_the_dataset(source: Path, tmp_path: Path) -> None:
    from h5forge import H5ImageDataset

    asset = Location(str(tmp_path / "store" / "photos"))
    first = _build(source, asset)
    (source / "cat" / sorted(os.listdir(source / "cat"))[0]).unlink()
    second = _build(source, asset)
    rows, manifest = version_rows(asset)
    ds = H5ImageDataset(str(tmp_path / "store" / "photos"))
    assert ds.version == second.sha256
    assert len(ds) == len(rows) == manifest.num_samples
    got = {ds.source_path(i): ds.classes[ds[i][1]] for i in range(len(ds))}
    assert got == {p: row[0] for p, row in rows.items()}
    old = H5ImageDataset(str(tmp_path / "store" / "photos"), version=first.sha256[:16])
    assert len(old) == len(ds) + 1  # the first version still reads, removed sample included
