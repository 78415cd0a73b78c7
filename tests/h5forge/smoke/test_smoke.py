"""``h5forge.smoke.load.smoke_load``: real DataLoader worker processes under fork and spawn."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import h5py
import pytest

from h5forge.errors import IntegrityError, UnsealedFileError
from h5forge.pack.writer import PackResult
from h5forge.smoke.load import smoke_load
from tests.fixtures.damage import flip_sample_byte

HAS_FORK = "fork" in multiprocessing.get_all_start_methods()
needs_fork = pytest.mark.skipif(not HAS_FORK, reason="the platform has no fork")


@needs_fork
@pytest.mark.slow
def test_decoded_file_reads_back_under_fork_and_spawn(packed_decoded: PackResult) -> None:
    report = smoke_load(packed_decoded.path, workers=2, batches=2, batch_size=8)
    assert [m.start_method for m in report.methods] == ["fork", "spawn"]
    assert all(m.samples == 16 and m.images_per_second > 0 for m in report.methods)
    assert report.samples_checked == 32
    assert report.images_per_second == min(m.images_per_second for m in report.methods)


@needs_fork
def test_encoded_file_is_checked_against_its_stored_bytes(packed_encoded: PackResult) -> None:
    report = smoke_load(
        packed_encoded.path, workers=2, batches=3, batch_size=4, start_methods=("fork",)
    )
    assert report.samples_checked == 12


def test_without_workers_it_reads_in_process_once(packed_decoded: PackResult) -> None:
    report = smoke_load(packed_decoded.path, workers=0, batches=100, batch_size=8)
    assert [m.start_method for m in report.methods] == ["main"]
    assert report.samples_checked == packed_decoded.num_samples  # capped at the file's size


@needs_fork
def test_a_flipped_pixel_fails_with_the_sample_named(
    packed_decoded: PackResult, tmp_path: Path
) -> None:
    path = tmp_path / "flipped.h5"
    shutil.copyfile(packed_decoded.path, path)
    flip_sample_byte(path, 0, mask=0x01, at=0)
    with pytest.raises(IntegrityError, match=r"flipped\.h5\[0\]: sha256 of pixels read") as info:
        smoke_load(str(path), workers=2, batches=1, batch_size=4, start_methods=("fork",))
    assert len(info.value.failures) == 1


def test_an_unsealed_file_is_refused(packed_decoded: PackResult, tmp_path: Path) -> None:
    path = tmp_path / "unsealed.h5"
    shutil.copyfile(packed_decoded.path, path)
    with h5py.File(path, "r+") as h5:
        del h5.attrs["sealed"]
    with pytest.raises(UnsealedFileError):
        smoke_load(str(path), workers=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": -1}, "negative"),
        ({"batches": 0}, "must both be >= 1"),
        ({"batch_size": 0}, "must both be >= 1"),
        ({"start_methods": ()}, "start_methods is empty"),
        ({"start_methods": ("teleport",)}, "not available on this platform"),
    ],
)
def test_bad_arguments_are_rejected_up_front(
    packed_decoded: PackResult, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        smoke_load(packed_decoded.path, **kwargs)  # type: ignore[arg-type]
