"""``cache_dir=``: a verified local copy of a remote asset (moto S3 on loopback), requests counted
at the server; concurrent processes with DataLoader workers filling one cache."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.files import mark, remove_tree
from h5forge.locks import lock_file
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.block_cache import ENTRY_KIND
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.remote_epoch import content, epoch
from tests.fixtures.servers import S3RequestLog

# One process's epoch over a cached asset, printed as JSON (argv: url, cache_dir; options on
# stdin): run twice at once by the concurrency test.
_EPOCH = """
import json, sys
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.remote_epoch import epoch
ds = H5ImageDataset(sys.argv[1], storage_options=json.load(sys.stdin), cache_dir=sys.argv[2])
print(json.dumps([[s, l, n] for (s, l), n in epoch(ds, "spawn").items()]))
"""


def _pack(root: Path, out: Path, seed: int) -> PackResult:
    write_image_folder(root, classes=("a", "b"), per_class=20, seed=seed, size=(20, 24))
    return pack(root, out, config=PackConfig(ImageConfig(resize="resize", size=(16, 16))))


@pytest.fixture(scope="module")
def two_assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[PackResult, PackResult]:
    tmp = tmp_path_factory.mktemp("cache_src")
    return _pack(tmp / "a", tmp / "a.h5", 3), _pack(tmp / "b", tmp / "b.h5", 4)


def _truth(path: str) -> Counter[tuple[str, int]]:
    ds = H5ImageDataset(path)
    return content(ds[i] for i in range(len(ds)))


def _object_reads(log: S3RequestLog, name: str) -> list[Any]:
    """GETs of the asset's bytes (not its sidecar)."""
    return [r for r in log() if r.method == "GET" and r.path.split("?")[0].endswith(f"/{name}")]


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir())


def _filled(ds: H5ImageDataset) -> Counter[tuple[str, int]]:
    """Every sample read in this process: the entry fills from those reads and completes."""
    return content(ds[i] for i in range(len(ds)))


@pytest.fixture
def published(
    two_assets: tuple[PackResult, PackResult], s3_bucket: str, s3_storage_options: dict[str, Any]
) -> str:
    url = f"s3://{s3_bucket}/a.h5"
    publish(two_assets[0].path, url, storage_options=s3_storage_options)
    return url


@pytest.mark.slow
def test_second_epoch_reads_nothing_remote(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    truth = _truth(two_assets[0].path)
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    # Opening downloads nothing: only ranged reads of the file's metadata, no entry complete.
    opened = _object_reads(s3_requests, "a.h5")
    assert all(r.range for r in opened), opened
    assert not list(tmp_path.glob("*/asset.h5"))
    assert epoch(ds, "spawn") == truth
    # The first epoch reads from the server (nothing is downloaded before it), and the entry
    # fills from those reads; the epoch read every sample, so it is whole and checked.
    assert _object_reads(s3_requests, "a.h5")
    (entry,) = _entries(tmp_path)
    assert sorted(p.name for p in entry.iterdir() if not p.name.startswith(".h5forge")) == [
        "asset.h5",
        "entry.json",
    ]
    assert (entry / "asset.h5").read_bytes() == Path(two_assets[0].path).read_bytes()
    s3_requests.clear()
    again = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    assert epoch(again, "spawn") == truth
    assert _object_reads(s3_requests, "a.h5") == []
    # This process only: HEAD of the object, HEAD and GET of its sidecar. The 2 workers get
    # its check pickled and read the local copy without asking the server anything.
    assert len(s3_requests()) <= 3, s3_requests()


@pytest.mark.parametrize("still_right", [False, True])
def test_a_copy_changed_after_the_check_is_checked_again(
    still_right: bool,
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    truth = _filled(ds)
    (entry,) = _entries(tmp_path)
    copy = entry / "asset.h5"
    good = copy.read_bytes()
    # What a DataLoader worker receives, after the copy changed on disk: touched and still
    # right (hashed again, served), or a flipped byte (hashed again, fetched again).
    changed = bytearray(good)
    if not still_right:
        changed[-100] ^= 0xFF
    copy.write_bytes(bytes(changed))
    s3_requests.clear()
    worker = pickle.loads(pickle.dumps(ds))
    assert _filled(worker) == truth
    # Still right: hashed again and served. Flipped: removed, read from the server and filled
    # again from those reads.
    assert bool(_object_reads(s3_requests, "a.h5")) is not still_right
    assert copy.read_bytes() == good
    if still_right:
        assert s3_requests() == []  # the identity changed, the hash did not: nothing asked


def test_limit_evicts_the_least_recently_used(
    two_assets: tuple[PackResult, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    a, b = two_assets
    for r in (a, b):
        publish(r.path, f"s3://{s3_bucket}/{Path(r.path).name}", storage_options=s3_storage_options)
    limit = int(max(a.bytes, b.bytes) * 1.5)  # room for one asset, not two
    opts = {"storage_options": s3_storage_options, "cache_dir": tmp_path, "cache_limit": limit}
    assert _filled(H5ImageDataset(f"s3://{s3_bucket}/a.h5", **opts)) == _truth(a.path)
    (first,) = _entries(tmp_path)
    assert (first / "asset.h5").is_file()
    ds_b = H5ImageDataset(f"s3://{s3_bucket}/b.h5", **opts)
    assert _filled(ds_b) == _truth(b.path)
    (second,) = _entries(tmp_path)  # a was evicted to make room for b's
    assert second != first
    assert (second / "asset.h5").read_bytes() == Path(b.path).read_bytes()
    # An asset larger than the whole limit is read remotely, and nothing is cached (not even
    # a block: none fits in 1 KiB).
    s3_requests.clear()
    small = H5ImageDataset(f"s3://{s3_bucket}/a.h5", **{**opts, "cache_limit": 1024})
    assert content(small[i] for i in range(len(small))) == _truth(a.path)
    assert _entries(tmp_path) == [second]
    assert len(_object_reads(s3_requests, "a.h5")) >= 2  # the head, then sample ranges


@pytest.mark.slow
def test_two_processes_with_workers_fill_one_entry(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parents[3]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EPOCH, published, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(json.dumps(s3_storage_options), timeout=240) for p in procs]
    truth = _truth(two_assets[0].path)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]
        assert Counter({(s, lab): n for s, lab, n in json.loads(out)}) == truth
    # Both filled one entry at once; it ended complete, its copy the published file.
    (entry,) = _entries(tmp_path)
    assert sorted(p.name for p in entry.iterdir() if not p.name.startswith(".h5forge")) == [
        "asset.h5",
        "entry.json",
    ]
    assert (entry / "asset.h5").read_bytes() == Path(two_assets[0].path).read_bytes()
    s3_requests.clear()
    again = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    assert _filled(again) == truth
    assert _object_reads(s3_requests, "a.h5") == []


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_flipped_byte_is_fetched_again(
    keep_mtime: bool,
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    _filled(H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path))
    (entry,) = _entries(tmp_path)
    copy = entry / "asset.h5"
    before = copy.stat()
    with open(copy, "r+b") as f:  # a byte near the end: sample pixels, not the header
        f.seek(before.st_size - 100)
        byte = f.read(1)
        f.seek(before.st_size - 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:  # mtime put back: the changed ctime still tells
        os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    s3_requests.clear()
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    assert not copy.exists()  # hashed again at open, found wrong, removed: never served
    assert _filled(ds) == _truth(two_assets[0].path)
    assert _object_reads(s3_requests, "a.h5")  # read from the server, filled again
    assert copy.read_bytes() == Path(two_assets[0].path).read_bytes()


def test_a_replaced_asset_is_not_served_from_the_cache(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    _filled(H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path))
    publish(two_assets[1].path, published, storage_options=s3_storage_options, overwrite=True)
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    assert _filled(ds) == _truth(two_assets[1].path)
    assert len(_entries(tmp_path)) == 2  # the new identity has its own entry


def test_an_entry_another_process_is_still_making_is_waited_for(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    """An entry folder found made but not yet marked (another process between its mkdir and
    its marker, under the entry's lock) is looked at again under that lock, not refused as
    someone else's: the copy is then made in it and read."""
    cache = tmp_path / "cache"
    _filled(H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=cache))
    (entry,) = _entries(cache)
    remove_tree(entry)
    made, go = threading.Event(), threading.Event()

    def other_process() -> None:
        with lock_file(f"{entry}.lock"):
            entry.mkdir()
            made.set()
            go.wait(30)  # the gap between its mkdir and its marker, held open by the test
            mark(entry, ENTRY_KIND)

    other = threading.Thread(target=other_process)
    other.start()
    assert made.wait(30)
    threading.Timer(0.3, go.set).start()
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=cache)
    other.join(30)
    assert _filled(ds) == _truth(two_assets[0].path)
    assert (entry / "asset.h5").is_file()


def test_planted_links_are_refused(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    _filled(H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=cache))
    (entry,) = _entries(cache)
    # A link in place of the copy (to a look-alike file): not read through, fetched again.
    decoy = tmp_path / "decoy.h5"
    decoy.write_bytes(Path(two_assets[1].path).read_bytes())
    (entry / "asset.h5").unlink()
    (entry / "asset.h5").symlink_to(decoy)
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=cache)
    assert _filled(ds) == _truth(two_assets[0].path)
    assert not (entry / "asset.h5").is_symlink()
    assert (entry / "asset.h5").read_bytes() == Path(two_assets[0].path).read_bytes()
    assert decoy.read_bytes() == Path(two_assets[1].path).read_bytes()  # left alone
    # A link in place of the entry folder: refused with a message naming it.
    moved = tmp_path / "moved"
    entry.rename(moved)
    entry.symlink_to(moved)
    with pytest.raises(ValueError, match="not made by h5forge's cache"):
        H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=cache)
    # The cache folder itself a link: refused.
    link = tmp_path / "cache-link"
    link.symlink_to(cache)
    with pytest.raises(ValueError, match="not a real folder"):
        H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=link)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_in_place_of_an_entry_record_is_not_waited_on(
    published: str,
    two_assets: tuple[PackResult, PackResult],
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    # Issue 28, class 3: a FIFO planted under the entry's record (a shared cache_dir) would
    # block the open forever; it is refused unopened, and the asset fetched again.
    _filled(H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path))
    (entry,) = _entries(tmp_path)
    (entry / "entry.json").unlink()
    os.mkfifo(entry / "entry.json")  # no writer ever comes
    ds = H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=tmp_path)
    assert _filled(ds) == _truth(two_assets[0].path)
    assert (entry / "entry.json").is_file()  # a fresh record in its place


def test_an_unusable_cache_dir_is_a_clear_error(
    published: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="cannot be created"):
        H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=blocker / "c")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "read-only"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not writable"):
            H5ImageDataset(published, storage_options=s3_storage_options, cache_dir=ro)
    with pytest.raises(ValueError, match="cache_limit"):
        H5ImageDataset(
            published, storage_options=s3_storage_options, cache_dir=tmp_path, cache_limit=0
        )
