"""The stored-copy kernel on its own: rows of one real packed file copied into another, checked
from the bytes the new file holds; damage in the source named with its reason."""

from __future__ import annotations

import hashlib
import os
import shutil
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge.asset.stored_copy import Mismatch, StoredCopy
from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from tests.fixtures.damage import flip_sample_byte

DECODED = PackConfig(ImageConfig(resize="resize", size=(24, 32)))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two sealed files of the same config and different images: a source and a target."""
    out: dict[str, Path] = {}
    for name, seed in (("source", 3), ("target", 4)):
        root = tmp_path_factory.mktemp(f"images_{name}")
        write_image_folder(root, classes=("ant", "bee"), per_class=5, seed=seed, size=(20, 40))
        out[name] = Path(
            pack(discover(root), root.parent / f"{name}.h5", workers=1, config=DECODED).path
        )
    return out


def _index(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path, "r") as h5:
        return h5["byte_ranges"][()].astype(np.int64), h5["digests"][()]


def _copy_rows(
    source: Path,
    target: Path,
    rows: range,
    to: int,
    index: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[list[Mismatch], StoredCopy]:
    """Copy ``rows`` of ``source`` (its ``index`` read before, or now) to rows ``to..`` of
    ``target`` (in place), checked."""
    src_ranges, digests = index or _index(source)
    dst_ranges, _ = _index(target)
    sel = np.arange(rows.start, rows.stop)
    dst_rows = range(to, to + len(sel))
    src_fd = os.open(source, os.O_RDONLY)
    dst_fd = os.open(target, os.O_WRONLY)
    try:
        with StoredCopy(str(target)) as copy:
            copy.copy_rows(
                dst_rows,
                src_fd,
                src_ranges[sel, 0],
                src_ranges[sel, 1],
                digests[sel],
                dst_fd,
                dst_ranges[to : to + len(sel), 0],
                writeback=True,
            )
            return copy.wait(), copy
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _stored(path: Path, row: int) -> bytes:
    offset, size = _index(path)[0][row]
    with path.open("rb") as f:
        f.seek(int(offset))
        return f.read(int(size))


def test_rows_of_one_file_land_in_rows_of_another(packed: dict[str, Path], tmp_path: Path) -> None:
    target = Path(shutil.copy(packed["target"], tmp_path / "t.h5"))
    failures, copy = _copy_rows(packed["source"], target, range(3, 8), to=1)
    assert failures == []
    assert copy.checked == 5
    for j in range(5):
        assert _stored(target, 1 + j) == _stored(packed["source"], 3 + j)
    # rows outside the range are untouched
    assert _stored(target, 0) == _stored(packed["target"], 0)
    assert _stored(target, 6) == _stored(packed["target"], 6)


def test_a_damaged_source_row_is_refused_with_its_reason(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    source = Path(shutil.copy(packed["source"], tmp_path / "s.h5"))
    target = Path(shutil.copy(packed["target"], tmp_path / "t.h5"))
    flip_sample_byte(source, 5)
    want = _index(source)[1][5].tobytes().hex()
    failures, _ = _copy_rows(source, target, range(3, 8), to=1)
    assert [m.row for m in failures] == [3]  # source row 5 went to row 3
    assert "sha256 of the copied bytes is" in failures[0].reason
    assert f"its source's /digests says {want}" in failures[0].reason


def test_a_source_that_ends_inside_a_sample_stops_the_copy(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    source = Path(shutil.copy(packed["source"], tmp_path / "s.h5"))
    target = Path(shutil.copy(packed["target"], tmp_path / "t.h5"))
    index = _index(source)
    offset, size = index[0][6]
    os.truncate(source, int(offset + size // 2))
    with pytest.raises(EOFError, match=rf"ends at byte {int(offset + size // 2)}"):
        _copy_rows(source, target, range(3, 8), to=1, index=index)


def test_an_in_hand_check_names_a_chunk_that_does_not_decompress(tmp_path: Path) -> None:
    pixels = bytes(range(256)) * 4
    good = zlib.compress(pixels)
    want = hashlib.sha256(pixels).digest()
    with StoredCopy(str(tmp_path / "unused.h5")) as copy:
        copy.check_in_hand(7, good, want, zlib.decompress)
        copy.check_in_hand(8, good[:-9] + b"\0" * 9, want, zlib.decompress)
        copy.check_in_hand(9, pixels[::-1], want)
        copy.fail(2, "HDF5 cannot decode its chunk (test)")
        failures = copy.wait()
    assert [m.row for m in failures] == [2, 8, 9]
    assert "does not decompress" in failures[1].reason
    assert "sha256 of the copied (decompressed) bytes is" in failures[2].reason
