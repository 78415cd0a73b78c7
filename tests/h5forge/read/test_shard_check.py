"""A local shard is checked once per file identity: in the process that forks ``loader()``'s
workers, inherited by them, and checked in full again whenever the file changed.

Each test reads a small sharded version (4 shards) through real DataLoader workers under
``fork``. A shard changed after the checks (replaced by another valid shard, rewritten in
place, an attribute rewritten at the same size, or only touched) is checked again in the
worker that reads it: refused with the messages of a first open, or, when only touched,
read as before.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.errors import IntegrityError
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.multi import H5MultiDataset
from h5forge.read.shard_check import Identity
from tests.fixtures.sharded_read import DECODED, make_sharded_version

VICTIM, OTHER = 2, 3  # shard 2 changed; shard 3 (as many samples) its valid replacement


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shard_check_src")
    write_image_folder(root, classes=("a", "b"), per_class=12, seed=3, size=(30, 40))
    catalog = discover(root)
    base = tmp_path_factory.mktemp("shard_check_pub") / "flowers"
    make_sharded_version(base, catalog, [range(k, 24, 4) for k in range(4)])
    return base


@pytest.fixture
def base(published: Path, tmp_path: Path) -> Path:
    """A copy of the version that a test may change."""
    out = tmp_path / "flowers"
    shutil.copytree(published, out)
    shutil.copy(f"{published}.latest.json", f"{out}.latest.json")
    return out


def _shard(ds: H5ImageDataset, k: int) -> Path:
    sv = ds._shards()
    return Path(sv.shard_url(k))


def _epoch(ds: H5ImageDataset, **kwargs: Any) -> dict[str, bytes]:
    """path -> pixels of every sample, through ``loader()``'s workers (fork)."""
    got: list[bytes] = []
    loader = ds.loader(5, num_workers=1, multiprocessing_context="fork", **kwargs)
    for images, _ in loader:
        got.extend(x.contiguous().numpy().tobytes() for x in images)
    return dict(zip(ds.sources, got, strict=True))


def _replace(victim: Path, other: Path) -> None:
    tmp = victim.with_suffix(".tmp")
    shutil.copyfile(other, tmp)
    os.replace(tmp, victim)  # another inode at the shard's name


def _rewrite(victim: Path, other: Path) -> None:
    with open(victim, "r+b") as f:  # the same inode, another shard's bytes
        f.write(other.read_bytes())
        f.truncate()


def _attribute(victim: Path, other: Path) -> None:
    before = os.stat(victim)
    with h5py.File(victim, "r+") as h5:
        old = str(h5.attrs["config_sha256"])  # 64 hex digits, one changed
        h5.attrs["config_sha256"] = old[:-1] + ("1" if old[-1] != "1" else "2")
    after = os.stat(victim)
    # Only mtime and ctime tell this file from the one checked.
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)


def _touch(victim: Path, other: Path) -> None:
    st = os.stat(victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


CHANGES: dict[str, Callable[[Path, Path], None]] = {
    "replaced": _replace,
    "rewritten in place": _rewrite,
    "an attribute rewritten in place": _attribute,
}


def test_workers_inherit_the_checks_made_before_they_fork(base: Path) -> None:
    ds = H5ImageDataset(base)

    def in_worker(_: int) -> None:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        sv = info.dataset.dataset._shards()  # type: ignore[attr-defined]
        checked = dict(sv._checked)
        assert sorted(checked) == [0, 1, 2, 3], "the workers did not inherit the checks"
        for k, done in checked.items():  # reopened by identity: the index checked once
            assert sv.shard(k).state.index is done.state.index
            assert sv.shard(k).state.reader is not done.state.reader

    first = _epoch(ds, worker_init_fn=in_worker)
    assert len(first) == 24
    assert _epoch(ds, worker_init_fn=in_worker) == first  # and again the next epoch


def test_spawned_workers_check_for_themselves(base: Path) -> None:
    ds = H5ImageDataset(base)
    loader = ds.loader(5, num_workers=1, multiprocessing_context="spawn")
    assert sum(len(x) for x, _ in loader) == 24
    assert ds._shards()._checked == {}  # nothing checked here that spawned workers cannot use


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_shard_changed_after_the_checks_is_refused_by_the_worker(base: Path, change: str) -> None:
    ds = H5ImageDataset(base)
    victim, other = _shard(ds, VICTIM), _shard(ds, OTHER)
    sha = ds._shards().manifest.shards[VICTIM].sha256

    def in_worker(_: int) -> None:  # after the checks, before the worker reads
        CHANGES[change](victim, other)

    with pytest.raises(IntegrityError, match=f"{sha[:16]}.*is not the shard {sha[:16]}"):
        _epoch(ds, worker_init_fn=in_worker)
    assert VICTIM in ds._shards()._checked  # checked here first: the worker refused it itself


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_shard_changed_between_epochs_is_refused(base: Path, change: str) -> None:
    ds = H5ImageDataset(base)
    victim, other = _shard(ds, VICTIM), _shard(ds, OTHER)
    sha = ds._shards().manifest.shards[VICTIM].sha256
    assert len(_epoch(ds)) == 24
    CHANGES[change](victim, other)
    with pytest.raises(IntegrityError, match=f"is not the shard {sha[:16]}"):
        _epoch(ds)
    ds.close()  # (a shard open here reads the file it opened: the one checked)
    with pytest.raises(IntegrityError, match=f"is not the shard {sha[:16]}"):
        ds[int(ds._shards().starts[VICTIM])]  # and in this process


def test_a_touched_shard_is_checked_again_and_reads_as_before(base: Path) -> None:
    ds = H5ImageDataset(base)
    first = _epoch(ds)
    sv = ds._shards()
    before = sv._checked[VICTIM]
    victim = _shard(ds, VICTIM)

    def touch_then_read(_: int) -> None:
        _touch(victim, victim)
        info = torch.utils.data.get_worker_info()
        assert info is not None
        mine = info.dataset.dataset._shards()  # type: ignore[attr-defined]
        assert mine.shard(VICTIM).state.index is not before.state.index  # checked again
        assert VICTIM not in mine._checked

    assert _epoch(ds, worker_init_fn=touch_then_read) == first
    # The next epoch's checks, here, see the new identity and check the shard once more.
    assert _epoch(ds) == first
    assert sv._checked[VICTIM].identity == Identity.at(sv.where.with_url(sv.shard_url(VICTIM)))
    assert sv._checked[VICTIM].identity != before.identity


def test_a_missing_shard_is_named_before_the_workers_start(base: Path) -> None:
    ds = H5ImageDataset(base)
    _epoch(ds)
    victim = _shard(ds, VICTIM)
    os.unlink(victim)
    with pytest.raises(FileNotFoundError, match=f"shard .*{victim.stem}.* is missing"):
        _epoch(ds)


def test_multi_dataset_workers_inherit_each_sharded_assets_checks(base: Path) -> None:
    multi = H5MultiDataset([str(base), str(base)])

    def in_worker(_: int) -> None:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        for d in info.dataset.dataset.datasets:  # type: ignore[attr-defined]
            assert sorted(d._shards()._checked) == [0, 1, 2, 3]

    loader = multi.loader(
        5, num_workers=1, multiprocessing_context="fork", worker_init_fn=in_worker
    )
    assert sum(len(x) for x, _ in loader) == 48


def test_filtered_shards_are_checked_before_the_fork_and_opened_in_full_by_workers(
    tmp_path: Path,
) -> None:
    root = tmp_path / "src"
    write_image_folder(root, classes=("a", "b"), per_class=6, seed=4, size=(30, 40))
    gz = dataclasses.replace(DECODED, compression="gzip")
    base = tmp_path / "gz"
    make_sharded_version(base, discover(root), [range(0, 12, 2), range(1, 12, 2)], config=gz)
    ds = H5ImageDataset(base)
    first = _epoch(ds)
    sv = ds._shards()
    assert sorted(sv._checked) == [0, 1]
    assert all(done.state.index.filtered for done in sv._checked.values())

    def in_worker(_: int) -> None:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        mine = info.dataset.dataset._shards()  # type: ignore[attr-defined]
        for k, done in mine._checked.items():  # read through HDF5: opened with the checks
            assert mine.shard(k).state.index is not done.state.index

    assert _epoch(ds, worker_init_fn=in_worker) == first
    assert len(first) == 12


def test_verify_reads_checks_a_batch_across_shards_and_names_the_corrupt_sample(
    base: Path,
) -> None:
    ds = H5ImageDataset(base, verify_reads=True)
    everything = list(range(len(ds)))
    images, labels = ds.read_batch(everything)  # every shard's share, each checked
    items = H5ImageDataset(base).__getitems__(everything)  # item by item, shard by shard
    assert [x.numpy().tobytes() for x in images] == [
        np.asarray(image).tobytes() for image, _ in items
    ]
    assert labels.tolist() == [label for _, label in items]
    sv = ds._shards()
    sh = sv.shard(VICTIM)
    offset = int(sh.state.index.byte_ranges[int(sh.rows[1]), 0])
    ds.close()
    with open(_shard(ds, VICTIM), "r+b") as f:  # one image byte: no metadata check sees it
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(IntegrityError, match=rf"sample {int(sh.rows[1])} .*read back with sha256"):
        _epoch(ds)  # checked again before the fork (it passes: images are not metadata);
        # the workers check each sample they read against its digest
    with pytest.raises(IntegrityError, match=rf"sample {int(sh.rows[1])} .*read back with sha256"):
        ds.read_batch(everything)
