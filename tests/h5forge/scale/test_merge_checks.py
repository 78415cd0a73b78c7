"""How the merge checks what it copies: published parts by their file's sha256 against the
sidecar (with the file's identity), bare parts sample by sample; the kernel copy's fallback."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import h5py
import numpy as np
import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.sidecar import SIDECAR_SUFFIX
from h5forge.read.dataset import H5ImageDataset
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import pack_part
from h5forge.scale.plan import plan_parts
from h5forge.verify.checks import verify
from tests.fixtures.damage import flip_sample_byte

DECODED = ImageConfig(resize="resize", size=(24, 32))
BUILDS: dict[str, dict[str, Any]] = {
    "raw": {"config": PackConfig(DECODED)},
    "gzip": {"config": PackConfig(DECODED, compression="gzip", compression_level=1)},
    "blob": {"config": PackConfig(ImageConfig(layout="encoded", resize="none", size=None))},
}
needs_kernel_copy = pytest.mark.skipif(
    not hasattr(os, "copy_file_range"), reason="os.copy_file_range is Linux-only"
)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    root = tmp_path_factory.mktemp("checks_src")
    write_image_folder(
        root,
        classes=("ant", "bee"),
        per_class=6,
        seed=11,
        size=((20, 50), (20, 50)),
        formats=("jpeg", "png"),
    )
    return discover(root)


@pytest.fixture(scope="module")
def published(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each build's staging folder: 3 published parts of 4 images, sidecars beside them."""
    out: dict[str, Path] = {}
    for name, kw in BUILDS.items():
        staging = tmp_path_factory.mktemp(f"published_{name}")
        for spec in plan_parts(catalog, samples_per_part=4):
            pack_part(catalog, spec, str(staging), **kw)
        out[name] = staging
    return out


@pytest.fixture(scope="module")
def refs(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory) -> dict[str, PackResult]:
    out = tmp_path_factory.mktemp("checks_ref")
    return {name: pack(catalog, out / f"{name}.h5", workers=1, **kw) for name, kw in BUILDS.items()}


def _staging(published: dict[str, Path], build: str, tmp_path: Path) -> list[Path]:
    """A private copy of a build's staging folder (parts and sidecars) to damage."""
    staging = Path(shutil.copytree(published[build], tmp_path / "staging"))
    parts = sorted(staging.glob("part-*.h5"))
    assert len(parts) == 3
    assert all(Path(str(s) + SIDECAR_SUFFIX).exists() for s in parts)
    return parts


def _assert_nothing_at(out: Path) -> None:
    assert not out.exists()
    assert not Path(str(out) + ".partial").exists()


def _assert_same_asset(got: str, ref: PackResult) -> None:
    """Verifies, and has the reference pack's digests, labels, splits and pixels."""
    verify(got)
    with h5py.File(got) as a, h5py.File(ref.path) as b:
        for name in ("digests", "labels", "splits", "paths", "classes", "split_names"):
            assert np.array_equal(a[name][()], b[name][()]), name
        if b.attrs["storage"] == "array":
            for i in range(b["images"].shape[0]):  # stored chunk and filter mask
                assert a["images"].id.read_direct_chunk((i, 0, 0, 0)) == b[
                    "images"
                ].id.read_direct_chunk((i, 0, 0, 0)), i
    got_ds, ref_ds = H5ImageDataset(got), H5ImageDataset(ref.path)
    assert len(got_ds) == len(ref_ds)
    for i in range(len(ref_ds)):
        (x, y), (x_ref, y_ref) = got_ds[i], ref_ds[i]
        assert y == y_ref
        assert np.array_equal(x.numpy(), x_ref.numpy()), i


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_published_parts_merge_into_the_local_pack(
    build: str, published: dict[str, Path], refs: dict[str, PackResult], tmp_path: Path
) -> None:
    urls = [str(s) for s in _staging(published, build, tmp_path)]
    merged = merge_parts(urls, tmp_path / "m.h5", max_bad_fraction=0.0)
    assert merged.num_samples == 12
    _assert_same_asset(merged.path, refs[build])


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_byte_flipped_after_publish_fails_the_file_hash(
    build: str, published: dict[str, Path], tmp_path: Path
) -> None:
    parts = _staging(published, build, tmp_path)
    sidecar = json.loads(Path(str(parts[1]) + SIDECAR_SUFFIX).read_text())
    flip_sample_byte(parts[1], 2)
    actual = hashlib.sha256(parts[1].read_bytes()).hexdigest()
    out = tmp_path / "out" / "m.h5"
    with pytest.raises(IntegrityError, match="part-00001.h5: sha256 of the part file") as e:
        merge_parts([str(s) for s in parts], out, max_bad_fraction=0.0)
    message = str(e.value)
    assert actual in message
    assert sidecar["sha256"] in message
    assert "find_done_parts" in message  # the fix: the re-run re-packs it
    _assert_nothing_at(out)


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_without_its_sidecar_the_same_part_is_checked_sample_by_sample(
    build: str, published: dict[str, Path], tmp_path: Path
) -> None:
    parts = _staging(published, build, tmp_path)
    flip_sample_byte(parts[1], 2)
    os.unlink(str(parts[1]) + SIDECAR_SUFFIX)  # a bare sealed file, among published ones
    out = tmp_path / "out" / "m.h5"
    with pytest.raises(IntegrityError, match=r"sample 6 \(sample 2 of .*part-00001\.h5\)"):
        merge_parts([str(s) for s in parts], out, max_bad_fraction=0.0)
    _assert_nothing_at(out)


def test_the_file_hash_covers_the_index_too(published: dict[str, Path], tmp_path: Path) -> None:
    """A changed label is no sample's digest; the file's sha256 still catches it."""
    parts = _staging(published, "raw", tmp_path)
    with h5py.File(parts[2], "r+") as h5:
        h5["labels"][0] = 1 - h5["labels"][0]
    out = tmp_path / "m.h5"
    with pytest.raises(IntegrityError, match="part-00002.h5: sha256 of the part file"):
        merge_parts([str(s) for s in parts], out, max_bad_fraction=0.0)
    _assert_nothing_at(out)


def test_a_part_of_another_size_fails_before_anything_is_copied(
    published: dict[str, Path], tmp_path: Path
) -> None:
    parts = _staging(published, "blob", tmp_path)
    with parts[0].open("ab") as f:
        f.write(b"\0" * 10)
    out = tmp_path / "m.h5"
    with pytest.raises(IntegrityError, match=r"part-00000.h5 has \d+ bytes, its sidecar"):
        merge_parts([str(s) for s in parts], out, max_bad_fraction=0.0)
    _assert_nothing_at(out)


def test_a_remote_part_is_hashed_after_its_download(
    published: dict[str, Path], tmp_path: Path
) -> None:
    fs = fsspec.filesystem("memory")
    staging = "memory://h5forge-test-merge-checks"
    try:
        for name in sorted(os.listdir(published["blob"])):
            fs.pipe_file(f"{staging}/{name}", (published["blob"] / name).read_bytes())
        urls = [f"{staging}/part-{i:05d}.h5" for i in range(3)]
        merged = merge_parts(urls, tmp_path / "good.h5", max_bad_fraction=0.0)
        assert merged.num_samples == 12
        data = bytearray(fs.cat_file(urls[1]))
        data[len(data) // 2] ^= 0x01
        fs.pipe_file(urls[1], bytes(data))
        with pytest.raises(IntegrityError, match=r"memory://.*part-00001.h5: sha256 of the pa"):
            merge_parts(urls, tmp_path / "bad.h5", max_bad_fraction=0.0)
    finally:
        fs.rm("/h5forge-test-merge-checks", recursive=True)
    _assert_nothing_at(tmp_path / "bad.h5")


def _during_the_copy_of(
    monkeypatch: pytest.MonkeyPatch, part: Path, act: Callable[[], None]
) -> None:
    """Run ``act`` once, right after the kernel copied the first range of ``part``."""
    real = os.copy_file_range
    inode = part.stat().st_ino
    done: list[bool] = []

    def copy_file_range(src: int, dst: int, count: int, *args: Any) -> int:
        n = real(src, dst, count, *args)
        if not done and os.fstat(src).st_ino == inode:
            done.append(True)
            act()
        return n

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)


def _rewrite_in_place(path: Path) -> None:
    """Same bytes, written again: only the modification time tells."""
    data = path.read_bytes()
    stat = path.stat()
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _replace_by_a_copy(path: Path) -> None:
    """Another file of the same bytes renamed over the part (what a re-publish does)."""
    tmp = path.with_suffix(".new")
    shutil.copyfile(path, tmp)
    os.replace(tmp, path)


@needs_kernel_copy
@pytest.mark.parametrize("change", [_rewrite_in_place, _replace_by_a_copy])
@pytest.mark.parametrize("build", ["raw", "blob"])
def test_a_part_changed_during_the_merge_fails_the_identity_check(
    build: str,
    change: Callable[[Path], None],
    published: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts = _staging(published, build, tmp_path)
    _during_the_copy_of(monkeypatch, parts[1], lambda: change(parts[1]))
    out = tmp_path / "m.h5"
    with pytest.raises(IntegrityError, match="part-00001.h5 changed during the merge"):
        merge_parts([str(s) for s in parts], out, max_bad_fraction=0.0)
    _assert_nothing_at(out)


@needs_kernel_copy
@pytest.mark.parametrize("failure", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, 0])
@pytest.mark.parametrize("build", ["raw", "blob"])
def test_without_the_kernel_copy_the_merge_copies_in_blocks(
    build: str,
    failure: int,
    published: dict[str, Path],
    refs: dict[str, PackResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """copy_file_range refused (or returning 0 early, ``failure`` 0): pread/pwrite instead."""
    calls: list[int] = []

    def copy_file_range(src: int, dst: int, count: int, *args: Any) -> int:
        calls.append(count)
        if failure:
            raise OSError(failure, os.strerror(failure))
        return 0

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    urls = [str(s) for s in _staging(published, build, tmp_path)]
    merged = merge_parts(urls, tmp_path / "m.h5", max_bad_fraction=0.0)
    assert len(calls) == 1  # tried once, then blocks for the rest of the merge
    _assert_same_asset(merged.path, refs[build])


@needs_kernel_copy
def test_another_copy_error_is_not_hidden(
    published: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def copy_file_range(*args: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    urls = [str(s) for s in _staging(published, "raw", tmp_path)]
    with pytest.raises(OSError, match="No space left"):
        merge_parts(urls, tmp_path / "m.h5", max_bad_fraction=0.0)
    _assert_nothing_at(tmp_path / "m.h5")


def test_many_local_and_remote_parts_hashed_a_few_at_a_time(
    catalog: Catalog, refs: dict[str, PackResult], tmp_path: Path
) -> None:
    """One part per image, the first two remote: hashes queue behind the copy; a remote
    part's turn comes at its copy; a damaged part far down the queue is still caught."""
    kw = BUILDS["blob"]
    fs = fsspec.filesystem("memory")
    remote = "memory://h5forge-test-merge-many"
    specs = plan_parts(catalog, samples_per_part=1)
    assert len(specs) == 12
    try:
        urls = [
            pack_part(catalog, s, remote if s.index < 2 else str(tmp_path / "staging"), **kw).url
            for s in specs
        ]
        merged = merge_parts(urls, tmp_path / "m.h5", max_bad_fraction=0.0)
        _assert_same_asset(merged.path, refs["blob"])
        flip_sample_byte(Path(urls[10]), 0)
        with pytest.raises(IntegrityError, match="part-00010.h5: sha256 of the part file"):
            merge_parts(urls, tmp_path / "bad.h5", max_bad_fraction=0.0)
    finally:
        fs.rm("/h5forge-test-merge-many", recursive=True)
    _assert_nothing_at(tmp_path / "bad.h5")
