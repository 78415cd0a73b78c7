"""Incremental pack (``pack(reuse=...)``): the file equals a full rebuild of the new source,
sample for sample, whatever changed; a previous file that is damaged, foreign or of another
configuration never leaks into it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge.asset import format as fmt
from h5forge.demo import write_image_folder
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse, unchanged_paths
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from tests.fixtures.damage import flip_sample_byte

_FIXED = ImageConfig(resize="resize", size=(24, 32))
CONFIGS: dict[str, PackConfig] = {
    "raw": PackConfig(_FIXED),
    "gzip": PackConfig(_FIXED, compression="gzip", compression_level=1),
    "blob": PackConfig(ImageConfig(layout="encoded", resize="none", size=None)),
}
# Root attributes a rebuild may differ in: the time, and the metadata digest that covers it.
_TIMESTAMPS = {fmt.A_CREATED_AT, fmt.A_METADATA_SHA256}


def _tokens(root: Path) -> dict[str, str]:
    """``relpath -> size:mtime`` of every file under ``root`` (what a caller compares)."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(root).as_posix()] = f"{st.st_size}:{st.st_mtime_ns}"
    return out


def _source(root: Path) -> Path:
    write_image_folder(
        root,
        classes=("cat", "dog", "eel"),
        per_class=4,
        splits=("train", "val"),
        seed=5,
        size=((20, 40), (20, 50)),
        formats=("jpeg", "png"),
    )
    (root / "train" / "dog" / "broken.jpg").write_bytes(b"")  # quarantined, every time
    return root


def _extra(tmp: Path, name: str, count: int, seed: int) -> list[Path]:
    return write_image_folder(
        tmp / f"extra-{name}", classes=(name,), per_class=count, seed=seed, size=(30, 30)
    )


def _add(root: Path, tmp: Path) -> None:
    for k, f in enumerate(_extra(tmp, "x", 2, 11)):
        shutil.copy(f, root / "train" / "cat" / f"new{k}{f.suffix}")


def _remove(root: Path, tmp: Path) -> None:
    for f in sorted((root / "val" / "dog").iterdir())[:2]:
        f.unlink()


def _replace(root: Path, tmp: Path) -> None:
    target = sorted((root / "train" / "eel").iterdir())[1]
    new = next(f for f in _extra(tmp, "y", 2, 12) if f.suffix == target.suffix)
    shutil.copy(new, target)  # the same name, new pixels (and a new size:mtime)


def _new_class(root: Path, tmp: Path) -> None:
    # "ant" sorts first: every other class index shifts by one
    for split in ("train", "val"):
        (root / split / "ant").mkdir()
        for f in _extra(tmp, f"ant-{split}", 5, 13):
            shutil.copy(f, root / split / "ant" / f.name)


def _removed_class(root: Path, tmp: Path) -> None:
    for split in ("train", "val"):
        shutil.rmtree(root / split / "cat")  # dog and eel move down one index


CHANGES: dict[str, Callable[[Path, Path], None]] = {
    "add": _add,
    "remove": _remove,
    "replace": _replace,
    "new-class": _new_class,
    "removed-class": _removed_class,
}


def _assert_same_file(got: str, want: str) -> None:
    """Every dataset and root attribute equal (but the timestamps), and the same stored bytes."""
    with h5py.File(got, "r") as a, h5py.File(want, "r") as b:
        names: list[str] = []
        b.visit(names.append)
        seen: list[str] = []
        a.visit(seen.append)
        assert sorted(seen) == sorted(names)
        for name in names:
            x, y = a[name], b[name]
            assert dict(x.attrs) == dict(y.attrs), name
            if isinstance(y, h5py.Group):
                continue
            assert (x.dtype, x.shape) == (y.dtype, y.shape), name
            np.testing.assert_array_equal(x[()], y[()], err_msg=name)
        assert set(a.attrs) == set(b.attrs)
        for key in set(b.attrs) - _TIMESTAMPS:
            assert a.attrs[key] == b.attrs[key], key
        images = a[fmt.IMAGES]
        if images.chunks is not None:  # the chunks as stored (compressed ones included)
            for j in range(images.shape[0]):
                got_chunk = images.id.read_direct_chunk((j, 0, 0, 0))
                assert got_chunk == b[fmt.IMAGES].id.read_direct_chunk((j, 0, 0, 0)), j
        ranges = b[fmt.BYTE_RANGES][()]
    with open(got, "rb") as f, open(want, "rb") as g:  # and the bytes of every sample
        for offset, size in ranges.tolist():
            f.seek(offset)
            g.seek(offset)
            assert f.read(size) == g.read(size)


def _both(
    new: Path, previous: str, config: PackConfig, unchanged: set[str], tmp: Path, workers: int = 1
) -> tuple[PackResult, PackResult]:
    kw = {"config": config, "workers": workers, "max_bad_fraction": 0.2}
    full = pack(new, tmp / "full.h5", **kw)  # type: ignore[arg-type]
    inc = pack(new, tmp / "inc.h5", reuse=Reuse(previous, unchanged), **kw)  # type: ignore[arg-type]
    _assert_same_file(inc.path, full.path)
    assert (inc.num_samples, inc.quarantined, inc.counts) == (
        full.num_samples,
        full.quarantined,
        full.counts,
    )
    assert full.reused == 0
    return full, inc


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("change", list(CHANGES))
def test_incremental_equals_full_rebuild(tmp_path: Path, change: str, config_name: str) -> None:
    config = CONFIGS[config_name]
    old = _source(tmp_path / "old")
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    new = tmp_path / "new"
    shutil.copytree(old, new, copy_function=shutil.copy2)  # keeps mtimes: files unchanged
    before = _tokens(new)
    CHANGES[change](new, tmp_path)
    unchanged = unchanged_paths(before, _tokens(new))
    full, inc = _both(new, previous.path, config, unchanged, tmp_path)
    with h5py.File(previous.path, "r") as h5:
        packed_before = set(h5[fmt.PATHS].asstr()[()].tolist())
    with h5py.File(full.path, "r") as h5:
        packed_now = h5[fmt.PATHS].asstr()[()].tolist()
    expected = sum(p in unchanged and p in packed_before for p in packed_now)
    assert inc.reused == expected > 0
    assert inc.reused < full.num_samples or change in ("remove", "removed-class")
    assert inc.reuse_mismatched == 0


def test_pool_workers_borrowed_samples_between_reused(tmp_path: Path) -> None:
    """Preprocessed samples come from the process pool (shared memory, borrowed) between
    reused ones, in catalog order."""
    old = _source(tmp_path / "old")
    config = CONFIGS["raw"]
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    new = tmp_path / "new"
    shutil.copytree(old, new, copy_function=shutil.copy2)
    before = _tokens(new)
    _new_class(new, tmp_path)  # 10 new images: more than the pool's minimum of 8
    _, inc = _both(new, previous.path, config, unchanged_paths(before, _tokens(new)), tmp_path, 2)
    assert inc.reused == 24


def test_config_change_reuses_nothing(tmp_path: Path) -> None:
    old = _source(tmp_path / "old")
    previous = pack(
        old, tmp_path / "prev.h5", config=CONFIGS["raw"], workers=1, max_bad_fraction=0.2
    )
    other = PackConfig(ImageConfig(resize="resize", size=(24, 30)))
    all_paths = set(_tokens(old))
    full, inc = _both(old, previous.path, other, all_paths, tmp_path)
    assert inc.reused == 0
    # the same config: everything is reused, nothing decoded
    _, same = _both(old, previous.path, CONFIGS["raw"], all_paths, tmp_path / "same")
    assert same.reused == same.num_samples == 24


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_corrupt_sample_is_preprocessed_not_copied(tmp_path: Path, config_name: str) -> None:
    config = CONFIGS[config_name]
    old = _source(tmp_path / "old")
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    flip_sample_byte(previous.path, 3)
    flip_sample_byte(previous.path, 17, at=0)
    _, inc = _both(old, previous.path, config, set(_tokens(old)), tmp_path)
    assert (inc.reused, inc.reuse_mismatched) == (22, 2)


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _unsealed(path: Path) -> None:
    with h5py.File(path, "r+") as h5:
        h5.attrs.modify(fmt.A_SEALED, False)


def _bad_label(path: Path) -> None:
    with h5py.File(path, "r+") as h5:
        h5[fmt.LABELS][0] = 99


def _chunk_one_byte_short(path: Path) -> None:
    """A chunk copied as its index says would spill into the next one."""
    with h5py.File(path, "r+") as h5:
        offset, size = h5[fmt.BYTE_RANGES][4]
        h5[fmt.BYTE_RANGES][4] = (offset, size - 1)


def _range_out_of_file(path: Path) -> None:
    with h5py.File(path, "r+") as h5:
        h5[fmt.BYTE_RANGES][2] = (path.stat().st_size, 10)


@pytest.mark.parametrize(
    "damage",
    [_garbage, _unsealed, _bad_label, _chunk_one_byte_short, _range_out_of_file, Path.unlink],
)
def test_untrusted_previous_is_refused_whole(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    old = _source(tmp_path / "old")
    config = CONFIGS["raw"]
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    damage(Path(previous.path))
    _, inc = _both(old, previous.path, config, set(_tokens(old)), tmp_path)
    assert (inc.reused, inc.reuse_mismatched) == (0, 0)


def test_unchanged_paths_compares_tokens() -> None:
    before = {"a.jpg": "1:2", "b.jpg": "3:4", "c.jpg": "", "gone.jpg": "5:6"}
    now = {"a.jpg": "1:2", "b.jpg": "3:5", "c.jpg": "", "new.jpg": "7:8"}
    assert unchanged_paths(before, now) == {"a.jpg"}


def test_reuse_checks_its_arguments(tmp_path: Path) -> None:
    assert Reuse(tmp_path / "x.h5", ["a"]) == Reuse(str(tmp_path / "x.h5"), frozenset({"a"}))
    with pytest.raises(TypeError, match="unchanged="):
        Reuse("x.h5", "a.jpg")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Reuse(3, set())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a local file"):
        Reuse("s3://bucket/v/prev.h5", {"a.jpg"})


def test_reused_bytes_span_several_read_batches(tmp_path: Path) -> None:
    """3 MB samples: the previous file is read in several batches through one buffer."""
    config = PackConfig(ImageConfig(resize="resize", size=(1024, 1024)))
    old = _source(tmp_path / "old")
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    new = tmp_path / "new"
    shutil.copytree(old, new, copy_function=shutil.copy2)
    before = _tokens(new)
    _replace(new, tmp_path)
    flip_sample_byte(previous.path, 20)  # in a later batch than the first
    _, inc = _both(new, previous.path, config, unchanged_paths(before, _tokens(new)), tmp_path)
    assert (inc.reused, inc.reuse_mismatched) == (22, 1)


@pytest.mark.parametrize("config_name", ["raw", "blob"])
def test_reused_bytes_move_in_runs_not_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_name: str
) -> None:
    """Unfiltered bytes go file to file (into chunks, or into the blob behind the head): one
    ``copy_file_range`` per stretch back to back in both files, not one per sample, and each
    byte of the new file is copied once (a reused one never through the blob's spool)."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this platform")
    config = CONFIGS[config_name]
    old = _source(tmp_path / "old")
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    new = tmp_path / "new"
    shutil.copytree(old, new, copy_function=shutil.copy2)
    before = _tokens(new)
    _replace(new, tmp_path)  # breaks the catalog's stretch of reused samples in two
    unchanged = unchanged_paths(before, _tokens(new))
    calls: list[int] = []  # bytes asked for, per call reading the previous file
    moved: list[int] = []  # bytes copied, per call, from any file
    real, previous_inode = os.copy_file_range, Path(previous.path).stat().st_ino

    def counted(src: int, dst: int, count: int, *args: int) -> int:
        if os.fstat(src).st_ino == previous_inode:
            calls.append(count)
        moved.append(real(src, dst, count, *args))
        return moved[-1]

    monkeypatch.setattr(os, "copy_file_range", counted)
    _, inc = _both(new, previous.path, config, unchanged, tmp_path)
    with h5py.File(previous.path, "r") as h5:
        paths = h5[fmt.PATHS].asstr()[()].tolist()
        sizes = h5[fmt.BYTE_RANGES][:, 1].tolist()
    assert inc.reused == 23
    # 23 samples in at most 3 stretches (split by the replaced file and the quarantined one)
    assert 1 <= len(calls) <= 3
    reused = sum(size for p, size in zip(paths, sizes, strict=True) if p in unchanged)
    assert sum(calls) == reused
    with h5py.File(inc.path, "r") as h5:
        stored = int(h5[fmt.BYTE_RANGES][:, 1].sum())
    # The full rebuild (packed first by _both) copies a blob's spool behind the head, all of
    # it; the incremental one, array: the preprocessed chunks are written by HDF5, only the
    # reused ones copied; blob: the reused bytes straight from the previous file and the
    # preprocessed ones from the spool, each byte once.
    blob = config_name == "blob"
    assert sum(moved) == (stored if blob else 0) + (stored if blob else reused)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_swapped_in_for_the_previous_file_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    """Issue 28, class 3: the previous version is opened again for the copy; a FIFO swapped in
    under its name after the plan is refused by its identity (nothing reused), never opened
    blocking (that hung the build)."""
    from h5forge.discover.catalog import discover
    from h5forge.pack.reuse import SampleSource

    old = _source(tmp_path / "old")
    config = CONFIGS["raw"]
    previous = pack(old, tmp_path / "prev.h5", config=config, workers=1, max_bad_fraction=0.2)
    source = SampleSource(
        discover(old), config, workers=1, reuse=Reuse(previous.path, set(_tokens(old)))
    )
    assert source.copies  # planned to copy from it
    os.unlink(previous.path)
    os.mkfifo(previous.path)  # no writer ever comes
    items = list(source)
    assert len(items) == len(discover(old).samples)
    assert (source.reused, source.refused) == (0, f"{previous.path} changed after it was checked")
