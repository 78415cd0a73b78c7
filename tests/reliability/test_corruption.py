"""Campaign 2, fast subset: byte flips in every region of every storage, truncations, and the
metadata digest that catches what the sample digests cannot."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.errors import IntegrityError
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.reliability import corruption

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return corruption.make_assets(tmp_path_factory.mktemp("corruption"))


def test_flips_and_truncations_never_pass_silently(tmp_path: Path) -> None:
    res = corruption.run(trials=60, truncations=12, seed=1, work=tmp_path)
    assert res.ok, res.summary()
    assert res.trials == 72
    regions = {key.split(":")[0] for key in res.outcomes}
    assert set(corruption.REGIONS) <= regions
    assert res.outcomes["truncation: clear error"] == 12


def _edit(path: Path, change: str) -> None:
    with h5py.File(path, "r+") as h5:
        if change == "created_at":
            h5.attrs[fmt.A_CREATED_AT] = "1999-12-31T23:59:59+00:00"
        elif change == "source_url":
            h5.attrs[fmt.A_SOURCE_URL] = "https://attacker.example/data.tar.gz"
        elif change == "class name":
            h5[fmt.CLASSES][0] = "kat"
        elif change == "path":
            h5[fmt.PATHS][3] = "train/cat/other.jpg"
        elif change == "quarantine reason":
            h5[fmt.QUARANTINE_REASONS][0] = "fine"
        elif change == "new attribute":
            h5.attrs["note"] = "added later"
        elif change == "digest removed":
            del h5.attrs[fmt.A_METADATA_SHA256]


@pytest.mark.parametrize(
    "change",
    [
        "created_at",
        "source_url",
        "class name",
        "path",
        "quarantine reason",
        "new attribute",
        "digest removed",
    ],
)
def test_metadata_changes_fail_verify(assets: dict[str, Path], tmp_path: Path, change: str) -> None:
    path = tmp_path / "x.h5"
    shutil.copyfile(assets["decoded-array"], path)
    verify(str(path))
    _edit(path, change)
    with pytest.raises(IntegrityError, match=fmt.A_METADATA_SHA256):
        verify(str(path))


def test_metadata_digest_ignores_sealed_and_is_stable(assets: dict[str, Path]) -> None:
    with h5py.File(assets["encoded-blob"], "r") as h5:
        assert h5.attrs[fmt.A_METADATA_SHA256] == metadata_sha256(h5)
        assert h5.attrs[fmt.A_SEALED]


def test_without_verify_reads_a_flipped_pixel_reads_back_wrong(
    assets: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "x.h5"
    shutil.copyfile(assets["decoded-array"], path)
    good = H5ImageDataset(path)[2][0].numpy()
    with h5py.File(path, "r") as h5:
        offset, size = (int(x) for x in h5[fmt.BYTE_RANGES][2])
    with open(path, "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)[0]
        f.seek(offset + size // 2)
        f.write(bytes([byte ^ 0x55]))
    plain = H5ImageDataset(path)[2][0].numpy()
    assert not np.array_equal(plain, good)  # documented: returned as is, no error
    with pytest.raises(IntegrityError, match="sample 2"):
        H5ImageDataset(path, verify_reads=True)[2]
    with pytest.raises(IntegrityError, match="sample 2: sha256"):
        verify(str(path))


def test_fletcher32_failure_is_an_integrity_error(assets: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    shutil.copyfile(assets["gzip-fletcher32"], path)
    with h5py.File(path, "r") as h5:
        offset, size = (int(x) for x in h5[fmt.BYTE_RANGES][1])
    data = bytearray(path.read_bytes())
    data[offset + size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sample 1"):
        verify(str(path))
    with pytest.raises(IntegrityError, match="sample 1"):
        H5ImageDataset(path)[1]


def test_impossible_byte_range_is_refused_at_open(assets: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    shutil.copyfile(assets["decoded-blob"], path)
    with h5py.File(path, "r+") as h5:
        h5[fmt.BYTE_RANGES][4] = (1 << 62, 1 << 61)
    with pytest.raises(IntegrityError, match=r"/byte_ranges\[4\]"):
        H5ImageDataset(path)
