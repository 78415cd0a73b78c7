"""Sharded versions in verify, versions, retention, shard garbage collection and diff (#29.6).

The versions are real: shards packed by ``pack_slice(shard=True)``, put under
``BASE/shards/<sha256>.h5``, a manifest and a format-2 pointer (tests/fixtures/sharded.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import IntegrityError, UnsafePathError
from h5forge.location import Location
from h5forge.pack.writer import pack
from h5forge.publish.diff import diff_files, resolve_pair
from h5forge.publish.history import (
    apply_retention,
    collect_shards,
    list_versions,
    scan_versions,
)
from h5forge.publish.manifest import (
    ShardEntry,
    VersionManifest,
    read_manifest,
    shard_key,
)
from h5forge.publish.named import resolve_named
from h5forge.publish.release import publish_version
from h5forge.publish.versions import asset_lock, version_url
from h5forge.verify.sharded import verify_version, verify_versions
from tests.fixtures.damage import flip_sample_byte
from tests.fixtures.sharded import (
    CONFIG,
    collect_loop,
    make_sharded_version,
    pack_shard,
    publish_loop,
    publish_manifest,
    shard_entry,
    upload_shard,
)

SLICES = [(0, 6), (6, 12), (12, 18), (18, 24)]


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """24 photos: classes ant, bee, cow, 4 each in train and val."""
    src = tmp_path_factory.mktemp("sharded-src") / "photos"
    write_image_folder(
        src, classes=("ant", "bee", "cow"), per_class=4, splits=("train", "val"), seed=3
    )
    return discover(src)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the shards are packed, once for the module."""
    return tmp_path_factory.mktemp("shard-work")


def _manifest(base: Path, sha: str) -> VersionManifest:
    return read_manifest(Location(version_url(str(base), sha, "sharded")), sha)


def _shard_file(base: Path, sha: str) -> Path:
    return base / shard_key(sha)


def _with_entry(base: Path, sha: str, k: int, **changes: Any) -> str:
    """A new version: the version ``sha`` with shard ``k``'s entry changed (the pointer moves)."""
    manifest = _manifest(base, sha)
    shards = list(manifest.shards)
    shards[k] = dataclasses.replace(shards[k], **changes)
    return publish_manifest(
        Location(str(base)), dataclasses.replace(manifest, shards=tuple(shards))
    )


# --------------------------------------------------------------------------- verify


def test_verify_checks_the_manifest_and_every_shard(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    sha = make_sharded_version(base, catalog, SLICES[:2], deleted={1: [0, 3]}, work=work)
    report = verify_version(Location(str(base)), sha[:16])
    assert report.sha256 == sha
    assert report.num_samples == 10
    assert report.num_classes == 3
    assert len(report.shards) == 2
    assert report.checked_samples == 12
    assert report.bytes == sum(_shard_file(base, s.sha256).stat().st_size for s in report.shards)
    assert [s.live for s in report.shards] == [6, 4]
    assert not any(s.failures for s in report.shards)
    # The name resolves to the manifest, by latest or by prefix, through the same function.
    assert resolve_named(Location(str(base)), None).kind == "sharded"
    assert resolve_named(Location(str(base) + ".h5"), sha[:20]).url.endswith(".version.json")


def _damage(case: str, base: Path, sha: str, first: str) -> str:
    """Damage the version ``sha`` of ``base`` (its first shard's sha256 is ``first``) as
    ``case`` says; return the version to verify."""
    entry = _manifest(base, sha).shards[0]
    path = _shard_file(base, first)
    if case == "missing":
        path.unlink()
    elif case == "flipped":
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
        flip_sample_byte(path, 2)
    elif case == "size":
        return _with_entry(base, sha, 0, bytes=entry.bytes + 1)
    elif case == "metadata":
        return _with_entry(base, sha, 0, metadata_sha256="0" * 64)
    elif case == "rows":
        return _with_entry(base, sha, 0, samples=entry.samples + 1)
    elif case == "splits":
        return _with_entry(base, sha, 0, splits={"train": 5, "val": 1})
    elif case == "labels":  # ant <-> bee: a map that does not go by name
        return _with_entry(base, sha, 0, labels=(1, 0, 2))
    elif case == "unmapped":  # -1 for a class the version has
        return _with_entry(base, sha, 0, labels=(-1, 1, 2))
    return sha


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("missing", "is not there"),
        ("flipped", "digest"),
        ("size", "bytes, its entry says"),
        ("metadata", "sealed metadata_sha256"),
        ("rows", "rows, its entry says"),
        ("splits", "live rows per split"),
        ("labels", "does not map by name"),
        ("unmapped", "does not map by name"),
    ],
)
def test_verify_names_the_shard_and_what_failed(
    catalog: Catalog, work: Path, tmp_path: Path, case: str, said: str
) -> None:
    base = tmp_path / "photos"
    sha = make_sharded_version(base, catalog, SLICES[:2], work=work)
    first, second = (s.sha256 for s in _manifest(base, sha).shards)
    target = _damage(case, base, sha, first)
    with pytest.raises(IntegrityError) as caught:
        verify_version(Location(str(base)), target)
    failures = caught.value.failures
    assert "1 of 2 shards failed" in str(caught.value)
    assert failures
    assert all(f.startswith(f"shard 0 ({first[:16]}): ") for f in failures)
    assert any(said in f for f in failures), failures
    assert second[:16] not in str(caught.value)  # the good shard is not named


def test_a_class_the_version_lacks_is_refused_on_live_rows_only(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    """Label -1: the shard's class is not in the version; every row of it must be deleted."""
    base = tmp_path / "photos"
    # Shard 0 holds train ant 0-3 and bee 0-1; the version has no "ant".
    sha = make_sharded_version(base, catalog, SLICES[:1], classes=("bee", "cow"), work=work)
    with pytest.raises(IntegrityError, match="4 live rows .* 'ant', which the version does not"):
        verify_version(Location(str(base)), sha)
    fine = make_sharded_version(
        base, catalog, SLICES[:1], classes=("bee", "cow"), deleted={0: [0, 1, 2, 3]}, work=work
    )
    report = verify_version(Location(str(base)), fine)
    assert report.num_samples == 2


def test_a_shard_shared_by_several_versions_is_verified_once(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    v1 = make_sharded_version(base, catalog, SLICES[:2], work=work)
    v2 = make_sharded_version(base, catalog, [SLICES[0], SLICES[2]], parent=v1, work=work)
    first, second = verify_versions(Location(str(base)), [v1, v2])
    assert (first.shared, second.shared) == (0, 1)
    assert [s.checked_samples for s in second.shards] == [0, 6]  # shard 0: checked in v1
    assert second.checked_samples == 6


@pytest.mark.parametrize("link", ["shards", "shard"])
def test_a_link_for_the_shards_folder_or_a_shard_is_refused(
    catalog: Catalog, work: Path, tmp_path: Path, link: str
) -> None:
    base = tmp_path / "photos"
    sha = make_sharded_version(base, catalog, SLICES[:1], work=work)
    elsewhere = tmp_path / "elsewhere"
    if link == "shards":
        (base / "shards").rename(elsewhere)
        (base / "shards").symlink_to(elsewhere)
    else:
        shard = _shard_file(base, _manifest(base, sha).shards[0].sha256)
        shard.rename(elsewhere)
        shard.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError):
        verify_version(Location(str(base)), sha)
    with pytest.raises(UnsafePathError):
        diff_files(*resolve_pair(Location(str(base)), [sha[:16], "latest"]))
    if link == "shards":
        with pytest.raises(UnsafePathError):
            collect_shards(Location(str(base)), min_age_s=0)
    assert elsewhere.exists()


# --------------------------------------------------------------------------- versions


def test_versions_lists_sharded_versions_beside_single_file_ones(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    single = pack(catalog.root, tmp_path / "all.h5", config=CONFIG, workers=1)
    file_version = publish_version(single.path, Location(str(base)))
    v1 = make_sharded_version(base, catalog, SLICES, parent=file_version.sha256, work=work)
    v2 = make_sharded_version(base, catalog, SLICES[:3], parent=v1, deleted={0: [1]}, work=work)
    scan = scan_versions(Location(str(base) + ".h5"))
    assert scan.skipped == 0
    kinds = [(v.sha256, v.kind, v.shards, v.num_samples, v.latest) for v in scan.versions]
    assert kinds == [
        (file_version.sha256, "file", None, None, False),  # publish_version records none
        (v1, "sharded", 4, 24, False),
        (v2, "sharded", 3, 17, True),
    ]
    assert [v.parent for v in scan.versions[1:]] == [file_version.sha256, v1]
    assert scan.versions[1].url == version_url(str(base), v1, "sharded")
    assert set(scan.manifests) == {v1, v2}
    # Retention of a mixed asset: the file version's folder goes whole, v1's manifest, and
    # the one shard only v1 named.
    removed = apply_retention(Location(str(base)), keep_versions=1, shard_min_age_s=0)
    assert removed == [file_version.url, version_url(str(base), v1, "sharded")]
    assert sorted(p.name for p in (base / "v").iterdir()) == [v2[:16]]
    named = {e.sha256 for e in _manifest(base, v2).shards}
    assert {p.name for p in (base / "shards").iterdir()} == {f"{s}.h5" for s in named}


def test_versions_order_a_sharded_chain_made_within_one_second_by_parent(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    same = "2026-12-04T10:00:00+00:00"
    shas = [make_sharded_version(base, catalog, SLICES[:1], created_at=same, work=work)]
    for rows in ([0], [0, 1], [0, 1, 2]):
        shas.append(
            make_sharded_version(
                base, catalog, SLICES[:1], created_at=same, parent=shas[-1],
                deleted={0: rows}, work=work,
            )
        )  # fmt: skip
    assert [v.sha256 for v in list_versions(Location(str(base)))] == shas


# --------------------------------------------------------------------------- retention + GC


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_retention_removes_old_sharded_versions_and_gc_their_unreferenced_shards(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    asset = Location(str(base))
    v1 = make_sharded_version(base, catalog, SLICES[:2], work=work)
    v2 = make_sharded_version(base, catalog, [SLICES[0], SLICES[2]], parent=v1, work=work)
    v3 = make_sharded_version(base, catalog, [SLICES[0], SLICES[3]], parent=v2, work=work)
    shards = {rows: shard_entry(pack_shard(catalog, rows, work), catalog.classes).sha256
              for rows in SLICES}  # fmt: skip
    # A young orphan (a publish in flight just uploaded it), an old orphan, and what is no shard.
    orphan_young = upload_shard(asset, pack_shard(catalog, (1, 5), work))
    orphan_old = upload_shard(asset, pack_shard(catalog, (2, 5), work))
    _age(_shard_file(base, orphan_old), 7200)
    (base / "shards" / "notes.txt").write_text("mine")
    for rows in SLICES[1:3]:
        _age(_shard_file(base, shards[rows]), 7200)

    # Shards younger than shard_min_age_s stay: versions go, their shards wait.
    removed = apply_retention(asset, keep_versions=1, min_age_s=0, shard_min_age_s=3600)
    assert removed == [version_url(str(base), v, "sharded") for v in (v1, v2)]
    assert not (base / "v" / v1[:16]).exists()
    assert not (base / "v" / v2[:16]).exists()
    assert [v.sha256 for v in list_versions(asset)] == [v3]
    left = {p.name for p in (base / "shards").iterdir()}
    assert f"{orphan_young}.h5" in left
    assert f"{orphan_old}.h5" not in left
    assert f"{shards[SLICES[1]]}.h5" not in left  # old, and no kept version names it
    assert f"{shards[SLICES[2]]}.h5" not in left
    assert "notes.txt" in left

    # With no minimum age, every unreferenced shard goes; what v3 names stays.
    collect_shards(asset, min_age_s=0)
    left = {p.name for p in (base / "shards").iterdir()}
    assert left == {f"{shards[SLICES[0]]}.h5", f"{shards[SLICES[3]]}.h5", "notes.txt"}
    assert verify_version(asset, v3).num_samples == 12


def test_gc_waits_for_a_publish_that_uploads_an_old_unreferenced_shard_again(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    # A shard no version names, old: garbage, until a publish uploads it again and names it.
    base = tmp_path / "photos"
    asset = Location(str(base))
    v1 = make_sharded_version(base, catalog, SLICES[:1], work=work)
    garbage = upload_shard(asset, pack_shard(catalog, SLICES[1], work))
    _age(_shard_file(base, garbage), 3600)
    removed: list[list[str]] = []
    with asset_lock(asset):  # the publish has begun
        gc = threading.Thread(target=lambda: removed.append(collect_shards(asset, min_age_s=60)))
        gc.start()
        gc.join(0.5)
        assert gc.is_alive()  # waiting for the publish: it has not listed the shard as garbage
        v2 = make_sharded_version(base, catalog, SLICES[:2], parent=v1, work=work)
    gc.join(60)
    assert removed == [[]]  # the listing came after the commit: the shard is v2's now
    assert _shard_file(base, garbage).is_file()
    assert verify_version(asset, v2).num_samples == 12
    # Once no version names it and it is old again, it goes (under the lock it takes itself).
    v3 = make_sharded_version(base, catalog, SLICES[:1], parent=v2, work=work)
    apply_retention(asset, keep_versions=1, shard_min_age_s=1e9)
    _age(_shard_file(base, garbage), 3600)
    assert collect_shards(asset, min_age_s=60) == [str(_shard_file(base, garbage))]
    assert verify_version(asset, v3).num_samples == 6


def test_gc_deletes_nothing_while_a_version_cannot_be_read(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    asset = Location(str(base))
    v1 = make_sharded_version(base, catalog, SLICES[:1], work=work)
    make_sharded_version(base, catalog, SLICES[1:2], parent=v1, work=work)
    damaged = base / "v" / v1[:16] / "photos.version.json"
    damaged.write_bytes(damaged.read_bytes()[:-9] + b"  \n")  # no longer hashes to its key
    assert collect_shards(asset, min_age_s=0) == []
    assert len(list((base / "shards").iterdir())) == 2
    damaged.unlink()  # now a folder without a manifest: a publish in flight, or debris
    assert len(collect_shards(asset, min_age_s=0)) == 1


def test_gc_on_the_loopback_s3(
    catalog: Catalog, work: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    asset = Location(f"s3://{s3_bucket}/sets/photos", s3_storage_options)
    v1 = make_sharded_version(asset, catalog, SLICES[:2], work=work)
    v2 = make_sharded_version(asset, catalog, [SLICES[0], SLICES[2]], parent=v1, work=work)
    kept = {s.sha256 for s in scan_versions(asset).manifests[v2].shards}
    gone = {s.sha256 for s in scan_versions(asset).manifests[v1].shards} - kept
    # Young: the default minimum age keeps every shard though v1 goes.
    assert apply_retention(asset, keep_versions=1) == [version_url(asset.url, v1, "sharded")]
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    assert collect_shards(asset, min_age_s=3600) == []
    removed = collect_shards(asset, min_age_s=3600, now=later)
    assert removed == [f"s3://{s3_bucket}/sets/photos/{shard_key(s)}" for s in gone]
    fs = asset.fs
    listed = {p.rsplit("/", 1)[1] for p in fs.ls(f"{s3_bucket}/sets/photos/shards")}
    assert listed == {f"{s}.h5" for s in kept}
    assert verify_version(asset, v2).num_samples == 12
    assert [v.sha256 for v in list_versions(asset)] == [v2]


# The race: one process publishes versions that reuse shards (uploading a shard only when
# its parent does not reference it), another runs retention and GC, on one local store.

# 16 shards of 4 samples, 3 to a version: a shard soon goes unreferenced, and old, and is
# collected, then may be chosen (and uploaded) again.
_POOL = [(i, i + 4) for i in range(0, 21, 4)] + [(i, i + 4) for i in range(1, 20, 2)]
_RACE_S = 2.5


def test_a_publish_that_reuses_shards_never_races_gc_into_a_missing_shard(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    pool = [str(pack_shard(catalog, rows, work)) for rows in _POOL]
    make_sharded_version(base, catalog, _POOL[:3], work=work)
    for sha in {shard_entry(Path(p), catalog.classes).sha256 for p in pool[:3]}:
        _age(_shard_file(base, sha), 60)  # old from the start: only references keep them
    context = multiprocessing.get_context("spawn")
    out, start = context.Queue(), context.Barrier(2)
    publisher = (str(base), pool, list(catalog.classes), _RACE_S, start, out)
    procs = [
        context.Process(target=publish_loop, args=publisher),
        context.Process(target=collect_loop, args=(str(base), _RACE_S, 0.5, start, out)),
    ]
    for p in procs:
        p.start()
    results = {r[0]: r[1:] for r in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    published, busy, missing = results["published"]
    removed_versions, removed_shards = results["collected"]
    assert busy == 0  # one publisher: its parent is always the latest
    assert missing == 0  # each new latest, read at once
    assert published >= 10, results
    assert removed_versions >= 5, results
    assert removed_shards >= 1, results
    # Every kept version reads: its manifest, every shard's bytes and every sample's digest.
    kept = list_versions(Location(str(base)))
    assert kept
    assert kept[-1].latest
    checked = verify_versions(Location(str(base)), [v.sha256 for v in kept])
    assert all(r.num_samples == 12 for r in checked)


# --------------------------------------------------------------------------- diff


def test_diff_between_single_file_and_sharded_versions(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    asset = Location(str(base))
    single = pack(catalog.root, tmp_path / "all.h5", config=CONFIG, workers=1)
    file_version = publish_version(single.path, asset).sha256
    full = make_sharded_version(base, catalog, SLICES, work=work)
    make_sharded_version(base, catalog, SLICES[:3], deleted={0: [0, 5]}, work=work)

    d = diff_files(*resolve_pair(asset, [file_version[:16], full[:16]]))
    assert d.samples == (24, 24)
    assert (d.added, d.removed, d.replaced, d.same) == (0, 0, 0, 24)
    assert not d.config_changed
    assert d.classes_added == d.classes_removed == ()
    d = diff_files(*resolve_pair(asset, [full[:16], "latest"]))
    assert d.samples == (24, 16)
    assert (d.added, d.removed, d.same) == (0, 8, 16)
    d = diff_files(*resolve_pair(asset, ["latest", file_version[:16]]))
    assert (d.added, d.removed, d.same) == (8, 0, 16)


def test_diff_of_a_sharded_version_sees_replaced_bytes(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    """The same path with another digest counts as replaced (a shard whose sample changed)."""
    base = tmp_path / "photos"
    v1 = make_sharded_version(base, catalog, SLICES[:1], work=work)
    other = dataclasses.replace(catalog, samples=tuple(
        dataclasses.replace(s, path=catalog.samples[(i + 1) % 6].path) if i < 6 else s
        for i, s in enumerate(catalog.samples)
    ))  # fmt: skip
    # The same relpaths over other images: every path is replaced.
    v2 = make_sharded_version(base, other, SLICES[:1], work=work / "other")
    d = diff_files(*resolve_pair(Location(str(base)), [v1[:16], v2[:16]]))
    assert (d.added, d.removed, d.replaced, d.same) == (0, 0, 6, 0)


def test_diff_refuses_a_shard_that_is_not_the_one_its_entry_names(
    catalog: Catalog, work: Path, tmp_path: Path
) -> None:
    base = tmp_path / "photos"
    v1 = make_sharded_version(base, catalog, SLICES[:1], work=work)
    v2 = _with_entry(base, v1, 0, metadata_sha256="1" * 64)
    with pytest.raises(IntegrityError, match="not the one its version names"):
        diff_files(*resolve_pair(Location(str(base)), [v1[:16], v2[:16]]))
    junk = b'{"format": "h5forge-version", "format_version": 1}\n'  # hashes to its key
    key = hashlib.sha256(junk).hexdigest()[:16]
    (base / "v" / key).mkdir()
    (base / "v" / key / "photos.version.json").write_bytes(junk)
    with pytest.raises(IntegrityError, match="the manifest is malformed"):
        diff_files(*resolve_pair(Location(str(base)), [v1[:16], key]))
    entry: ShardEntry = _manifest(base, v1).shards[0]
    _shard_file(base, entry.sha256).unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        diff_files(*resolve_pair(Location(str(base)), [v1[:16], v1[:16]]))


@pytest.mark.parametrize("age", [-1.0, float("nan"), float("inf"), True, "1"])
def test_a_shard_age_that_is_not_a_finite_number_of_seconds_is_refused(
    tmp_path: Path, age: Any
) -> None:
    asset = Location(str(tmp_path / "photos"))
    with pytest.raises(ValueError, match="shard_min_age_s="):
        apply_retention(asset, keep_versions=1, shard_min_age_s=age)
    with pytest.raises(ValueError, match="min_age_s="):
        collect_shards(asset, min_age_s=age)
