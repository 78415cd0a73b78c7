"""Immutable versions: publish_version, list_versions, retention, the pointer, the CLI.

The same tests on a local folder and on loopback S3 (moto) where the store matters; the object
store's own request log shows what was (not) written.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

from h5forge.asset.open import open_h5
from h5forge.errors import BusyError, ChecksumError, StoreError, UnsafePathError
from h5forge.location import LISTED_ENTRY_BYTES, Location
from h5forge.pack.writer import PackResult
from h5forge.publish import history
from h5forge.publish.history import apply_retention, list_versions, scan_versions
from h5forge.publish.release import publish_version
from h5forge.publish.sidecar import read_sidecar, sidecar_url
from h5forge.publish.storage import publish
from h5forge.publish.versions import (
    asset_base,
    pointer_url,
    read_pointer,
    resolve_version,
    version_key,
    version_url,
)
from tests.fixtures.s3_faults import S3Faults, impatient


@dataclass
class Store:
    name: str
    base: str  # a folder URL; assets go under it
    options: dict[str, Any]
    requests: Any  # the S3 request log, or None on a local folder

    def fs(self) -> Any:
        return fsspec.core.url_to_fs(self.base, **self.options)[0]

    def cat(self, url: str) -> bytes:
        fs, path = fsspec.core.url_to_fs(url, **self.options)
        fs.invalidate_cache()
        return bytes(fs.cat_file(path))

    def files(self) -> dict[str, int]:
        """Every object under the store's base and its size."""
        fs, path = fsspec.core.url_to_fs(self.base, **self.options)
        fs.invalidate_cache()
        return {k: v["size"] for k, v in fs.find(path, detail=True).items()}


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "file":
        (tmp_path / "pub").mkdir()
        yield Store("file", str(tmp_path / "pub"), {}, None)
    else:
        bucket = request.getfixturevalue("s3_bucket")
        options = request.getfixturevalue("s3_storage_options")
        yield Store("s3", f"s3://{bucket}/assets", options, request.getfixturevalue("s3_requests"))


def _blob(tmp_path: Path, tag: str) -> Path:
    """A small file that stands for a packed asset (publish copies bytes, it does not parse)."""
    path = tmp_path / "local" / f"{tag}.h5"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + tag.encode() + os.urandom(4096))
    return path


def _writes(store: Store) -> list[str]:
    """PUTs and DELETEs the S3 server saw since its log was cleared."""
    return [f"{m} {p}" for m, p, _ in store.requests() if m in ("PUT", "DELETE", "POST")]


def test_v2_becomes_latest_and_v1_still_opens(
    store: Store, packed_decoded: PackResult, packed_encoded: PackResult
) -> None:
    url = f"{store.base}/flowers"
    v1 = publish_version(packed_decoded.path, Location(url, store.options))
    v2 = publish_version(packed_encoded.path, Location(url, store.options))

    assert (v1.parent, v2.parent) == ("", v1.sha256)
    assert v2.sha256 == Location.of(packed_encoded.path).sha256()
    assert v2.version == v2.sha256[:16]
    assert v2.url == version_url(url, v2.sha256) == f"{url}/v/{v2.version}/flowers.h5"
    assert v2.pointer_url == f"{url}.latest.json"
    assert not (v1.unchanged)
    assert not (v2.unchanged)
    pointer = read_pointer(Location(url, store.options))
    assert pointer is not None
    assert (pointer.sha256, pointer.parent) == (v2.sha256, v1.sha256)
    assert resolve_version(Location(url + ".h5", store.options), "latest")[0] == v2.url
    # The old version is untouched: byte for byte, and it opens as an h5forge file.
    assert store.cat(v1.url) == Path(packed_decoded.path).read_bytes()
    with open_h5(Location(v1.url, store.options)) as h5:
        assert h5["images"].shape[0] == packed_decoded.num_samples
    sidecar = read_sidecar(v2.url, storage_options=store.options)
    assert (sidecar["sha256"], sidecar["parent"]) == (v2.sha256, v1.sha256)

    listed = list_versions(Location(url, store.options))
    assert [(v.sha256, v.latest, v.parent) for v in listed] == [
        (v1.sha256, False, ""),
        (v2.sha256, True, v1.sha256),
    ]
    assert listed[0].bytes == os.path.getsize(packed_decoded.path)


def test_same_file_twice_is_unchanged_and_writes_nothing(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set.h5"
    local = _blob(tmp_path, "a")
    first = publish_version(local, Location(url, store.options))
    before = store.files()
    if store.requests is not None:
        store.requests.clear()
    pointer = read_pointer(Location(url, store.options))

    again = publish_version(local, Location(url, store.options))

    assert again.unchanged
    assert not first.unchanged
    assert (again.url, again.sha256, again.removed) == (first.url, first.sha256, ())
    assert store.files() == before
    assert read_pointer(Location(url, store.options)) == pointer  # not rewritten
    if store.requests is not None:
        assert _writes(store) == []


def test_republishing_an_old_version_moves_the_pointer_back(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set"
    a, b = _blob(tmp_path, "a"), _blob(tmp_path, "b")
    va = publish_version(a, Location(url, store.options))
    vb = publish_version(b, Location(url, store.options))
    before = store.files()

    back = publish_version(a, Location(url, store.options))

    assert back.unchanged
    assert (back.sha256, back.parent) == (va.sha256, vb.sha256)
    pointer = read_pointer(Location(url, store.options))
    assert pointer is not None
    assert pointer.sha256 == va.sha256
    assert store.files().keys() == before.keys()  # only the pointer was rewritten


def test_retention_keeps_the_newest_n(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set"
    results = [
        publish_version(_blob(tmp_path, t), Location(url, store.options), keep_versions=2)
        for t in "abcd"
    ]

    assert [r.removed for r in results] == [(), (), (results[0].url,), (results[1].url,)]
    listed = list_versions(Location(url, store.options))
    assert [v.sha256 for v in listed] == [r.sha256 for r in results[2:]]
    names = {Path(k).name for k in store.files()}
    assert names == {"set.h5", "set.h5.manifest.json", "set.latest.json"}
    assert len(store.files()) == 5


def test_retention_never_removes_the_latest(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set"
    a, b, c = (_blob(tmp_path, t) for t in "abc")
    va, vb, vc = (publish_version(x, Location(url, store.options)) for x in (a, b, c))

    # The pointer goes back to the oldest; retention keeps one by count, and the latest.
    back = publish_version(a, Location(url, store.options), keep_versions=1)

    assert back.removed == (vb.url,)
    assert [v.sha256 for v in list_versions(Location(url, store.options))] == [
        va.sha256,
        vc.sha256,
    ]
    assert store.cat(va.url) == a.read_bytes()


def test_retention_respects_the_minimum_age(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set"
    first, _ = (publish_version(_blob(tmp_path, t), Location(url, store.options)) for t in "ab")
    now = dt.datetime.now(dt.timezone.utc)
    kwargs: dict[str, Any] = {"keep_versions": 1}

    assert (
        apply_retention(
            Location(url, store.options),
            min_age_s=3600,
            now=now + dt.timedelta(minutes=30),
            **kwargs,
        )
        == []
    )
    assert len(list_versions(Location(url, store.options))) == 2
    assert apply_retention(
        Location(url, store.options), min_age_s=3600, now=now + dt.timedelta(hours=2), **kwargs
    ) == [first.url]
    assert len(list_versions(Location(url, store.options))) == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"keep_versions": 0}, "keep_versions=0"),
        ({"keep_versions": True}, "keep_versions=True"),
        ({"keep_versions": 2.0}, "keep_versions=2.0"),
        ({"min_age_s": -1.0}, "min_age_s=-1.0"),
        ({"min_age_s": float("nan")}, "min_age_s=nan"),
        ({"now": dt.datetime(2030, 1, 1)}, "timezone-aware"),  # noqa: DTZ001 - the point
    ],
)
def test_retention_refuses_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], words: str):
    with pytest.raises(ValueError, match=words):
        apply_retention(Location(str(tmp_path / "set")), **kwargs)


@pytest.mark.parametrize(
    ("url", "extra", "words"),
    [
        ("s3://bucket", None, "names no asset"),
        ("{tmp}/set", {"parent": "0" * 64}, "'parent'"),
        ("{tmp}/set", None, "keep_versions=0"),
    ],
)
def test_publish_version_refuses_bad_arguments(
    tmp_path: Path, url: str, extra: dict[str, Any] | None, words: str
) -> None:
    keep = 0 if "keep" in words else 5
    with pytest.raises(ValueError, match=words):
        publish_version(
            _blob(tmp_path, "a"),
            Location(url.format(tmp=tmp_path)),
            extra=extra,
            keep_versions=keep,
        )
    assert not (tmp_path / "set").exists()
    assert not (tmp_path / "set.latest.json").exists()


def test_a_version_key_never_leaves_v() -> None:
    with pytest.raises(ValueError, match="hex"):
        version_key("set", "../../etc")
    assert version_key("set", "ab" * 32) == f"v/{'ab' * 8}/set.h5"


_SHA = "c" * 64


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{" + b" " * (64 * 1024) + b"}", "over 65536 bytes"),
        (b"\xff\xfe not json", "not JSON"),
        (json.dumps({"format": "other", "sha256": _SHA}).encode(), "not an h5forge pointer"),
        (json.dumps([1, 2]).encode(), "not an h5forge pointer"),
        (json.dumps({"format": "h5forge-latest", "format_version": 9}).encode(), "version 9"),
        (
            json.dumps({"format": "h5forge-latest", "format_version": 1, "sha256": "XYZ"}).encode(),
            "'XYZ' is not 64",
        ),
        (  # non-canonical: a trailing newline is not part of a sha256
            json.dumps(
                {"format": "h5forge-latest", "format_version": 1, "sha256": _SHA + "\n"}
            ).encode(),
            "is not 64",
        ),
        (
            json.dumps(
                {"format": "h5forge-latest", "format_version": 1, "sha256": _SHA, "parent": 7}
            ).encode(),
            "parent 7",
        ),
    ],
)
def test_a_hostile_pointer_is_refused(store: Store, tmp_path: Path, body: bytes, words: str):
    url = f"{store.base}/set"
    fs = store.fs()
    fs.pipe_file(fsspec.core.url_to_fs(pointer_url(url), **store.options)[1], body)

    for call in (
        lambda: read_pointer(Location(url, store.options)),
        lambda: resolve_version(Location(url, store.options), "latest"),
        lambda: list_versions(Location(url, store.options)),
        lambda: publish_version(_blob(tmp_path, "a"), Location(url, store.options)),
    ):
        with pytest.raises(ValueError, match=words):
            call()
    assert store.files().keys() == {fsspec.core.url_to_fs(pointer_url(url), **store.options)[1]}


def test_a_pointers_path_is_ignored(store: Store) -> None:
    url = f"{store.base}/set"
    body = {
        "format": "h5forge-latest",
        "format_version": 1,
        "sha256": _SHA,
        "path": "../../elsewhere/secret.h5",
        "name": "../other",
    }
    store.fs().pipe_file(
        fsspec.core.url_to_fs(pointer_url(url), **store.options)[1], json.dumps(body).encode()
    )

    pointer = read_pointer(Location(url, store.options))

    assert pointer is not None
    assert pointer.url == f"{url}/v/{_SHA[:16]}/set.h5"
    with pytest.raises(FileNotFoundError, match="no version"):
        resolve_version(Location(url, store.options), _SHA[:16])


def test_unrecognised_entries_under_v_are_skipped_and_never_deleted(
    store: Store, tmp_path: Path
) -> None:
    url = f"{store.base}/set"
    fs = store.fs()
    vdir = fsspec.core.url_to_fs(f"{url}/v", **store.options)[1]
    good = json.dumps({"format": "h5forge", "sha256": "e" * 64, "bytes": 3})
    planted = {
        "not-hex-at-all/set.h5": b"x",
        "ABCDEF0123456789/set.h5": b"x",  # upper case: not a key we write
        "0123456789abcdef/set.h5": b"no sidecar",
        "1111111111111111/set.h5.manifest.json": json.dumps({"format": "other"}).encode(),
        "2222222222222222/set.h5.manifest.json": good.encode(),  # sha does not match the key
        "3333333333333333/set.h5.manifest.json": b"{not json",
        "4444444444444444": b"a plain file, not a folder",
    }
    for key, data in planted.items():
        fs.makedirs(os.path.dirname(f"{vdir}/{key}"), exist_ok=True)
        fs.pipe_file(f"{vdir}/{key}", data)
    if store.name == "file":  # a link to a real version elsewhere is not one of ours
        elsewhere = tmp_path / "elsewhere"
        other = publish_version(_blob(tmp_path, "z"), Location(str(elsewhere)), keep_versions=1)
        (Path(vdir) / other.version).symlink_to(elsewhere / "v" / other.version)
    versions = [publish_version(_blob(tmp_path, t), Location(url, store.options)) for t in "ab"]
    before = store.files()

    scan = scan_versions(Location(url, store.options))
    removed = apply_retention(Location(url, store.options), keep_versions=1)

    assert [v.sha256 for v in scan.versions] == [v.sha256 for v in versions]
    assert scan.skipped == len(planted) + (store.name == "file")
    assert removed == [versions[0].url]
    gone = {k for k in before if "/v/" + versions[0].version + "/" in k}
    assert gone
    assert store.files() == {k: n for k, n in before.items() if k not in gone}
    if store.name == "file":
        assert (elsewhere / "v" / other.version / "elsewhere.h5").is_file()


def test_over_ten_thousand_entries_is_refused(tmp_path: Path) -> None:
    vdir = tmp_path / "set" / "v"
    vdir.mkdir(parents=True)
    for i in range(10_001):
        (vdir / f"{i:016x}").mkdir()
    with pytest.raises(ValueError, match="10001 entries, over 10000"):
        list_versions(Location(str(tmp_path / "set")))
    with pytest.raises(ValueError, match="10001 entries"):
        apply_retention(Location(str(tmp_path / "set")), keep_versions=1)
    assert sum(1 for _ in vdir.iterdir()) == 10_001


def test_a_flat_asset_stays_beside_its_versions(
    store: Store, packed_decoded: PackResult, packed_encoded: PackResult
) -> None:
    flat = f"{store.base}/flowers.h5"
    publish(packed_decoded.path, flat, storage_options=store.options)
    old_file, old_sidecar = store.cat(flat), store.cat(sidecar_url(flat))
    if store.requests is not None:
        store.requests.clear()

    v = publish_version(packed_encoded.path, Location(flat, store.options))

    assert asset_base(flat) == f"{store.base}/flowers"
    assert v.url == f"{store.base}/flowers/v/{v.version}/flowers.h5"
    assert v.pointer_url == f"{store.base}/flowers.latest.json"
    assert (store.cat(flat), store.cat(sidecar_url(flat))) == (old_file, old_sidecar)
    with open_h5(Location(flat, store.options)) as h5:  # the flat asset keeps opening as a file
        assert h5["images"].shape[0] == packed_decoded.num_samples
    if store.requests is not None:
        assert not [
            w
            for w in _writes(store)
            if w.endswith(("/flowers.h5", ".h5.manifest.json")) and "/v/" not in w
        ]
    assert [x.sha256 for x in list_versions(Location(flat, store.options))] == [v.sha256]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "h5forge.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_lists_versions(tmp_path: Path, packed_decoded: PackResult) -> None:
    url = str(tmp_path / "set")
    v1 = publish_version(
        packed_decoded.path, Location(url), extra={"num_samples": packed_decoded.num_samples}
    )
    v2 = publish_version(_blob(tmp_path, "b"), Location(url))

    r = _cli("versions", url + ".h5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(v1.version)
    assert lines[1].startswith(v2.version)
    assert f"{packed_decoded.num_samples} samples" in lines[0]
    assert "latest" not in lines[0]
    assert "latest" in lines[1]
    assert f"parent {v1.version}" in lines[1]
    assert f"{v1.bytes:,} bytes" in lines[0]
    assert "parent -" in lines[0]

    r = _cli("versions", url, "--json")
    body = json.loads(r.stdout)
    assert r.returncode == 0
    assert body["skipped"] == 0
    assert [(x["sha256"], x["latest"]) for x in body["versions"]] == [
        (v1.sha256, False),
        (v2.sha256, True),
    ]


def test_cli_exits_1_when_the_asset_has_no_versions(tmp_path: Path) -> None:
    (tmp_path / "set" / "v" / "junk").mkdir(parents=True)
    r = _cli("versions", str(tmp_path / "set"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "has no published versions" in r.stderr
    assert "1 entries there" in r.stderr
    r = _cli("versions", "s3://bucket")
    assert r.returncode == 2
    assert "names no asset" in r.stderr


def test_retention_removes_sidecar_then_preview_then_file(store: Store, tmp_path: Path) -> None:
    url = f"{store.base}/set"
    old, _ = (publish_version(_blob(tmp_path, t), Location(url, store.options)) for t in "ab")
    fs, old_path = fsspec.core.url_to_fs(old.url, **store.options)
    fs.pipe_file(old_path + ".preview.png", b"\x89PNG")
    if store.requests is not None:
        store.requests.clear()

    assert apply_retention(Location(url, store.options), keep_versions=1) == [old.url]

    assert not any(f"/v/{old.version}/" in k for k in store.files())
    if store.requests is not None:
        deleted = [p.rsplit("/", 1)[1] for m, p, _ in store.requests() if m == "DELETE"]
        assert deleted == [
            "set.h5.manifest.json",
            "set.h5.preview.png",
            "set.h5.sources.json",
            "set.h5",
        ]
    else:
        assert not Path(old_path).parent.exists()  # the emptied folder goes too


def test_a_given_sha256_is_checked_at_the_destination_not_trusted(
    store: Store, tmp_path: Path
) -> None:
    url = f"{store.base}/set"
    local = _blob(tmp_path, "a")
    other = Location.of(_blob(tmp_path, "b")).sha256()
    with pytest.raises(ChecksumError, match=other):
        publish_version(local, Location(url, store.options), sha256=other)
    assert read_pointer(Location(url, store.options)) is None
    assert not any(k.endswith(".manifest.json") for k in store.files())
    with pytest.raises(ValueError, match="sha256='ABC' is not 64"):
        publish(local, f"{store.base}/flat.h5", storage_options=store.options, sha256="ABC")
    right = publish_version(
        local, Location(url, store.options), sha256=Location.of(local).sha256(), min_age_s=0
    )
    assert right.sha256 == Location.of(local).sha256()
    assert store.cat(right.url) == local.read_bytes()


def test_a_publish_based_on_a_stale_latest_is_refused_before_writing(
    store: Store, tmp_path: Path
) -> None:
    url = f"{store.base}/set"
    a, b = _blob(tmp_path, "a"), _blob(tmp_path, "b")
    v1 = publish_version(a, Location(url, store.options), based_on="")
    before = store.files()
    called: list[Location] = []
    with pytest.raises(BusyError, match=f"moved to version {v1.version} .*based on no version"):
        publish_version(b, Location(url, store.options), based_on="", beside=called.append)
    assert called == []  # refused before anything of b was written
    assert store.files() == before
    # The same bytes as latest are no conflict; a build based on latest publishes.
    assert publish_version(a, Location(url, store.options), based_on="").unchanged
    v2 = publish_version(b, Location(url, store.options), based_on=v1.sha256, beside=called.append)
    assert [str(c) for c in called] == [v2.url]
    assert v2.parent == v1.sha256


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("level", ["base", "v", "version"])
def test_a_link_at_any_level_of_an_asset_is_never_followed(tmp_path: Path, level: str) -> None:
    """A link planted in asset A's tree, pointing into asset B's, must not let A's retention
    delete B's versions, A's publish write into B, or A's readers read B's files."""
    store = tmp_path / "pub"
    a, b = str(store / "a"), str(store / "b")
    olds = [publish_version(_blob(tmp_path, f"b{i}"), Location(b)) for i in range(3)]
    first = publish_version(_blob(tmp_path, "a0"), Location(a))
    before = _snapshot(store / "b")
    target = {"base": store / "a", "v": store / "a" / "v", "version": Path(first.url).parent}
    planted = target[level]
    link_to = {"base": store / "b", "v": store / "b" / "v", "version": Path(olds[0].url).parent}
    os.rename(planted, tmp_path / "moved-away")
    os.symlink(link_to[level], planted)
    if level == "version":  # a version folder that is a link: skipped by the listing
        publish_version(_blob(tmp_path, "a1"), Location(a), keep_versions=1, min_age_s=0)
        assert apply_retention(Location(a), keep_versions=1, min_age_s=0) == []
    else:
        with pytest.raises(UnsafePathError, match="symbolic link, inside the asset"):
            publish_version(_blob(tmp_path, "a1"), Location(a), keep_versions=1, min_age_s=0)
        with pytest.raises(UnsafePathError, match="symbolic link, inside the asset"):
            apply_retention(Location(a), keep_versions=1, min_age_s=0)
        with pytest.raises(UnsafePathError, match="symbolic link, inside the asset"):
            list_versions(Location(a))
    with pytest.raises(UnsafePathError, match="symbolic link, inside the asset"):
        resolve_version(Location(a), first.version)
    assert _snapshot(store / "b") == before  # nothing of B deleted, written or replaced


def test_a_version_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    a = str(tmp_path / "pub" / "a")
    first = publish_version(_blob(tmp_path, "a0"), Location(a))
    secret = tmp_path / "secret.h5"
    os.rename(first.url, secret)
    os.symlink(secret, first.url)
    for version in ("latest", first.version):
        with pytest.raises(UnsafePathError, match="a symbolic link, inside the asset"):
            resolve_version(Location(a), version)


def test_a_listing_trickled_a_byte_at_a_time_ends_in_a_store_error(
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bucket's LIST answers come a byte every 0.2 s, each within the client's read timeout:
    listing the versions (as retention and ``h5forge versions`` do) ends in a StoreError once
    the bound of a listing of MAX_VERSIONS entries has passed, never a hang. (MAX_VERSIONS is
    cut to 10 here: at 10,000 the bound is ~90 s with this client.)"""
    url = f"s3://{s3_bucket}/assets/set"
    publish_version(_blob(tmp_path, "a"), Location(url, s3_storage_options))
    monkeypatch.setattr(history, "MAX_VERSIONS", 10)
    options = impatient(s3_storage_options)
    s3_faults.trickle(f"s3://{s3_bucket}", 0.2, times="always", method="GET")
    bound = Location.of(url, options).read_timeout(10 * LISTED_ENTRY_BYTES)["timeout"]
    started = time.monotonic()
    with pytest.raises(StoreError, match="the store sent its answer too slowly"):
        list_versions(Location(url, options))
    assert time.monotonic() - started < bound + 10
    assert {kind for *_, kind in s3_faults.injected} == {"trickle"}
