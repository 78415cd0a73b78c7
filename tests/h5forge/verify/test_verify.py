"""verify: a good file passes; flipped bytes, truncation, bad labels and unsealed files fail."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import pytest

from h5forge.errors import IntegrityError, UnsealedFileError
from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify


@pytest.fixture
def copy_of(tmp_path: Path):
    def make(result: PackResult) -> Path:
        dst = tmp_path / Path(result.path).name
        shutil.copyfile(result.path, dst)
        return dst

    return make


@pytest.mark.parametrize("which", ["packed_decoded", "packed_encoded"])
def test_good_file_verifies(which: str, request: pytest.FixtureRequest) -> None:
    result: PackResult = request.getfixturevalue(which)
    report = verify(result.path)
    data = Path(result.path).read_bytes()
    assert report.sha256 == hashlib.sha256(data).hexdigest()
    assert report.bytes == len(data)
    assert report.num_samples == result.num_samples == report.checked_samples
    assert report.num_classes == 3
    assert report.format_version == 1


@pytest.mark.parametrize("which", ["packed_decoded", "packed_encoded"])
def test_flipped_byte_names_the_sample(which: str, request: pytest.FixtureRequest, copy_of) -> None:
    path = copy_of(request.getfixturevalue(which))
    with h5py.File(path) as h5:
        offset, nbytes = (int(x) for x in h5["byte_ranges"][5])
    with open(path, "r+b") as f:
        f.seek(offset + nbytes // 2)
        b = f.read(1)
        f.seek(offset + nbytes // 2)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(
        IntegrityError,
        match=r"sample 5: sha256 of stored bytes is [0-9a-f]{64}, "
        r"/digests says [0-9a-f]{64}",
    ) as info:
        verify(path)
    assert len(info.value.failures) == 1
    ds = H5ImageDataset(path, verify_reads=True)
    ds[4]  # an intact neighbour reads fine
    with pytest.raises(IntegrityError, match="sample 5"):
        ds[5]


def test_truncated_file_is_a_clear_error(packed_decoded: PackResult, copy_of) -> None:
    path = copy_of(packed_decoded)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(IntegrityError, match="truncated"):
        verify(path)
    with pytest.raises(IntegrityError, match="truncated"):
        H5ImageDataset(path)[0]


def test_unsealed_file_is_refused(packed_decoded: PackResult, copy_of) -> None:
    path = copy_of(packed_decoded)
    with h5py.File(path, "r+") as h5:
        del h5.attrs["sealed"]
    with pytest.raises(UnsealedFileError, match="not sealed"):
        verify(path)
    with pytest.raises(UnsealedFileError, match="not sealed"):
        H5ImageDataset(path)
    partial = path.with_name(path.name + ".partial")
    path.rename(partial)
    with pytest.raises(UnsealedFileError, match=r"\.partial"):
        verify(partial)
    with pytest.raises(UnsealedFileError, match=r"\.partial"):
        H5ImageDataset(partial)


def test_unknown_version_is_refused(packed_decoded: PackResult, copy_of) -> None:
    path = copy_of(packed_decoded)
    with h5py.File(path, "r+") as h5:
        h5.attrs["format_version"] = 99
    with pytest.raises(UnsealedFileError, match="format version 99"):
        H5ImageDataset(path)


def test_every_failing_check_is_listed(packed_decoded: PackResult, copy_of) -> None:
    path = copy_of(packed_decoded)
    with h5py.File(path, "r+") as h5:
        labels = h5["labels"]
        labels[3] = 12
        labels[7] = -1
        h5.attrs["config_sha256"] = "0" * 64
    with pytest.raises(IntegrityError) as info:
        verify(path)
    text = str(info.value)
    assert "label 12 out of range: file declares 3 classes (0..2) in /labels[3]" in text
    assert "/labels[7]" in text
    assert "config_sha256" in text


def test_sampled_verify_checks_a_seeded_subset(packed_decoded: PackResult) -> None:
    a = verify(packed_decoded.path, sample_fraction=0.25, seed=1)
    b = verify(packed_decoded.path, sample_fraction=0.25, seed=1)
    assert a.checked_samples == b.checked_samples == round(packed_decoded.num_samples * 0.25)
    with pytest.raises(ValueError, match="sample_fraction"):
        verify(packed_decoded.path, sample_fraction=0)


@pytest.mark.parametrize("mapped", [False, True])
def test_hash_local_ranges_hashes_each_range_once(tmp_path: Path, mapped: bool) -> None:
    """Both ways of reading (preadv, or the writer's mapping of its own file) give each
    range's sha256 of the file's bytes, ranges across the 8 MiB read blocks included; a
    range that runs past the end of the file is never reported."""
    import random

    from h5forge.verify.digests import hash_local_ranges

    rng = random.Random(7)
    data = rng.randbytes(20 << 20)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    ranges, at = [], 4099  # not page aligned
    while at < len(data) - (3 << 20):
        size = rng.randrange(1, 3 << 20)
        ranges.append((len(ranges), at, size))
        at += size + rng.randrange(0, 5000)
    ranges.append((len(ranges), len(data) - 10, 11))  # one byte past the end
    got: dict[int, bytes] = {}
    seen = [0]
    hash_local_ranges(
        str(path),
        list(reversed(ranges)),
        lambda i, digest, _: got.__setitem__(i, digest),
        lambda n: seen.__setitem__(0, seen[0] + n),
        mapped=mapped,
    )
    want = {i: hashlib.sha256(data[o : o + n]).digest() for i, o, n in ranges[:-1]}
    assert got == want
    assert seen[0] >= sum(n for _, _, n in ranges[:-1])
