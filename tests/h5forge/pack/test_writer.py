"""Pack round trips: pixels, bytes, labels, splits, compression, atomicity."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image, ImageOps

from h5forge.demo import write_image_folder
from h5forge.errors import (
    EmptyDatasetError,
    IntegrityError,
    MissingExtraError,
    TooManyBadImagesError,
)
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset


def _pillow_resize(path: Path, h: int, w: int) -> np.ndarray:
    """Independent expectation: EXIF transpose, RGB, bilinear resize to exactly (h, w)."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        return np.asarray(im.resize((w, h), Image.BILINEAR))


def _tree_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_decoded_round_trip_matches_pillow(split_tree: Path, packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    with h5py.File(packed_decoded.path) as h5:
        paths = h5["paths"].asstr()[()].tolist()
    assert len(ds) == len(_tree_files(split_tree)) == packed_decoded.num_samples
    for i, rel in enumerate(paths):
        image, label = ds[i]
        assert image.dtype.is_floating_point is False
        assert tuple(image.shape) == (3, 32, 48)
        want = _pillow_resize(split_tree / rel, 32, 48)
        got = image.permute(1, 2, 0).numpy()
        diff = np.abs(got.astype(int) - want.astype(int))
        if rel.endswith(".png"):  # torch's kernel: Pillow's filter, within rounding
            assert diff.max() <= 1, rel
        else:  # JPEG draft decoding may differ from a full decode by rounding
            assert diff.mean() <= 12, rel
        assert ds.classes[label] == rel.split("/")[1]


def test_labels_classes_and_splits_follow_the_folder(
    split_tree: Path, packed_decoded: PackResult
) -> None:
    assert packed_decoded.classes == ("cat", "dog", "eel")
    with h5py.File(packed_decoded.path) as h5:
        paths = h5["paths"].asstr()[()].tolist()
        splits = [h5["split_names"].asstr()[c] for c in h5["splits"][()]]
        labels = h5["labels"][()].tolist()
    assert paths == sorted(paths, key=lambda p: (p.split("/")[0] != "train", p))
    for rel, split, label in zip(paths, splits, labels, strict=True):
        s, cls, _ = rel.split("/")
        assert (split, packed_decoded.classes[label]) == (s, cls)
    train = H5ImageDataset(packed_decoded.path, split="train")
    val = H5ImageDataset(packed_decoded.path, split="val")
    assert len(train) + len(val) == packed_decoded.num_samples
    assert train.class_to_idx == {"cat": 0, "dog": 1, "eel": 2}
    assert packed_decoded.counts["train"] == {"cat": 6, "dog": 6, "eel": 6}


def test_encoded_original_keeps_source_bytes(split_tree: Path, packed_encoded: PackResult) -> None:
    with h5py.File(packed_encoded.path) as h5:
        assert h5["images"].chunks is None  # contiguous blob
        offsets = h5["offsets"][()]
        blob = h5["images"]
        for i, rel in enumerate(h5["paths"].asstr()[()]):
            stored = blob[offsets[i] : offsets[i + 1]].tobytes()
            assert stored == (split_tree / rel).read_bytes()
            assert bytes(h5["digests"][i]) == hashlib.sha256(stored).digest()
    ds = H5ImageDataset(packed_encoded.path)
    image, _ = ds[0]
    assert image.dtype.is_floating_point is False
    assert image.shape[0] == 3


def test_variable_size_decoded_uses_blob_with_shapes(split_tree: Path, tmp_path: Path) -> None:
    res = pack(
        split_tree,
        tmp_path / "var.h5",
        config=PackConfig(ImageConfig(resize="none", size=None)),
        workers=1,
    )
    ds = H5ImageDataset(res.path)
    with h5py.File(res.path) as h5:
        assert h5.attrs["storage"] == "blob"
        assert h5.attrs["layout"] == "decoded"
        shapes = h5["shapes"][()]
        paths = h5["paths"].asstr()[()].tolist()
    for i in (0, len(ds) - 1):
        image, _ = ds[i]
        assert tuple(image.shape) == (3, shapes[i][0], shapes[i][1])
        with Image.open(split_tree / paths[i]) as im:
            want = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        if paths[i].endswith(".png"):
            np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), want)


@pytest.mark.parametrize(
    ("compression", "level", "fletcher32"),
    [
        ("gzip", 1, False),
        ("lzf", None, False),
        ("blosc-lz4", None, False),
        ("zstd", 3, True),
        ("none", None, True),
    ],
)
def test_compression_reads_back_identical(
    split_tree: Path,
    packed_decoded: PackResult,
    tmp_path: Path,
    compression: str,
    level: int | None,
    fletcher32: bool,
) -> None:
    res = pack(
        split_tree,
        tmp_path / "c.h5",
        config=PackConfig(
            ImageConfig(resize="resize", size=(32, 48)),
            compression=compression,
            compression_level=level,
            fletcher32=fletcher32,
        ),
        workers=1,
    )
    plain = H5ImageDataset(packed_decoded.path)
    comp = H5ImageDataset(res.path)
    idx = list(range(len(plain)))
    for (a, la), (b, lb) in zip(plain.__getitems__(idx), comp.__getitems__(idx), strict=True):
        assert la == lb
        assert bool((a == b).all())


def test_missing_plugin_names_the_extra(
    split_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "hdf5plugin", None)  # import now raises ImportError
    with pytest.raises(MissingExtraError, match=r"h5forge\[plugins\]"):
        pack(split_tree, tmp_path / "z.h5", config=PackConfig(compression="zstd"))
    assert not list(tmp_path.iterdir())


def test_existing_output_is_kept_unless_overwrite(
    packed_decoded: PackResult, split_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "x.h5"
    out.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        pack(split_tree, out)
    assert out.read_bytes() == b"precious"


def test_too_many_bad_images_fails_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=3, seed=1, size=(20, 20))
    (src / "a" / "broken.jpg").write_bytes(b"")
    (src / "b" / "junk.png").write_bytes(os.urandom(300))
    out = tmp_path / "o" / "x.h5"
    with pytest.raises(TooManyBadImagesError, match="2 of 8") as info:
        pack(src, out, max_bad_fraction=0.1, workers=1)
    assert {p for p, _ in info.value.quarantined} == {"a/broken.jpg", "b/junk.png"}
    assert not out.exists()
    assert not list(out.parent.glob("*.partial*"))
    res = pack(src, out, max_bad_fraction=0.25, workers=1)
    assert res.num_samples == 6
    assert res.num_quarantined == 2
    with h5py.File(out) as h5:
        assert sorted(h5["quarantine/paths"].asstr()[()]) == ["a/broken.jpg", "b/junk.png"]
        assert all(h5["quarantine/reasons"].asstr()[()])


@pytest.mark.parametrize("workers", [1, 2])  # in this process; the pool's ring
def test_a_write_the_disk_gets_wrong_fails_the_pack_before_its_seal(
    split_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """A filesystem that keeps other bytes than the pack wrote (one byte of one sample's chunk
    flipped on its way down) fails the pack at the seal's check of every sample's sha256,
    read back from the file: nothing is left at the output's name."""
    chunk = 32 * 48 * 3
    flipped: list[int] = []
    real_pwrite, real_pwritev = os.pwrite, os.pwritev

    def flip(bufs: list[bytearray]) -> list[bytearray]:
        if not flipped and sum(len(b) for b in bufs) >= chunk:
            bufs[-1][len(bufs[-1]) // 2] ^= 0xFF
            flipped.append(1)
        return bufs

    monkeypatch.setattr(
        os, "pwrite", lambda fd, b, at: real_pwrite(fd, flip([bytearray(b)])[0], at)
    )
    monkeypatch.setattr(
        os, "pwritev", lambda fd, bs, at: real_pwritev(fd, flip([bytearray(b) for b in bs]), at)
    )
    out = tmp_path / "x.h5"
    cfg = PackConfig(ImageConfig(resize="resize", size=(32, 48)))
    with pytest.raises(IntegrityError, match="failed verification") as info:
        pack(split_tree, out, config=cfg, workers=workers)
    assert flipped
    assert len(info.value.failures) == 1
    assert "sha256 of stored bytes" in info.value.failures[0]
    assert not out.exists()
    assert not list(tmp_path.glob("*.partial*"))
    monkeypatch.undo()
    assert pack(split_tree, out, config=cfg, workers=workers).num_samples == 36


def test_class_losing_every_image_is_an_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image_folder(src, classes=("a",), per_class=3, seed=1, size=(20, 20))
    (src / "b").mkdir()
    (src / "b" / "empty.jpg").write_bytes(b"")
    with pytest.raises(EmptyDatasetError, match="'b'"):
        pack(src, tmp_path / "x.h5", max_bad_fraction=1.0, workers=1)


def test_killed_pack_never_leaves_the_final_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image_folder(
        src, classes=("a", "b"), per_class=200, seed=2, size=(120, 160), formats=("png",)
    )
    out = tmp_path / "killed.h5"
    code = (
        "from h5forge.pack.writer import pack; from h5forge.preprocess.config import ImageConfig;"
        "from h5forge.pack.config import PackConfig;"
        f"pack({str(src)!r}, {str(out)!r},"
        " config=PackConfig(ImageConfig(resize='resize', size=(64, 64))), workers=1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    partial = Path(str(out) + ".partial")
    deadline = time.monotonic() + 120
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    assert not out.exists()
