"""Target values carried with reused samples (``Reuse(targets=True)``, what a shard rewrite
uses): each kept row's stored target bytes go into the new file as they were, checked against
their digests; a damaged value or a file of other columns is never carried."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse
from h5forge.pack.writer import pack_slice
from h5forge.preprocess.config import ImageConfig
from tests.fixtures.damage import flip_sample_byte
from tests.fixtures.targets_data import sample_rows, write_listing_with_columns

CONFIG = PackConfig(ImageConfig(resize="resize", size=(24, 32)))
GZIP = PackConfig(ImageConfig(resize="resize", size=(24, 32)), compression="gzip")


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Catalog, Path]:
    rows = sample_rows(8, seed=3)
    for i, row in enumerate(rows):
        row["caption"] = f"caption-{i:03d}"
    w = write_listing_with_columns(tmp_path / "src", rows)
    catalog = discover(w.root, listing=w.listing)
    out = tmp_path / "first.h5"
    pack_slice(catalog, out, config=CONFIG, workers=1)
    return catalog, out


def _stored(path: Path, column: str) -> list[bytes]:
    """Each row's stored bytes in ``column`` (not a number column)."""
    with h5py.File(path, "r") as h5:
        values = h5[f"targets/{column}/values"][()]
        offsets = h5[f"targets/{column}/offsets"][()].astype(np.int64)
    return [values[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def _rewrite(catalog: Catalog, keep: list[int], tmp: Path) -> Catalog:
    """``catalog``'s rows ``keep``, as a rewrite sees them: no source file, no target value."""
    return dataclasses.replace(
        catalog,
        samples=tuple(
            dataclasses.replace(catalog.samples[i], path=str(tmp / "gone" / str(i)), targets=())
            for i in keep
        ),
    )


def test_kept_rows_carry_their_stored_targets(packed: tuple[Catalog, Path], tmp_path: Path) -> None:
    catalog, first = packed
    keep = [0, 2, 3, 6, 7]
    part = _rewrite(catalog, keep, tmp_path)
    out = tmp_path / "second.h5"
    reuse = Reuse(str(first), frozenset(s.relpath for s in part.samples), targets=True)
    result = pack_slice(part, out, config=CONFIG, workers=1, reuse=reuse)
    assert result.reused == result.num_samples == len(keep)
    for column in ("tags", "caption", "boxes", "mask"):
        old = _stored(first, column)
        assert _stored(out, column) == [old[i] for i in keep], column
    with h5py.File(first, "r") as a, h5py.File(out, "r") as b:
        assert a.attrs["targets_json"] == b.attrs["targets_json"]
        for column in ("score", "count", "mask"):
            extra = "shapes" if column == "mask" else "values"
            assert b[f"targets/{column}/{extra}"][()].tolist() == [
                a[f"targets/{column}/{extra}"][i].tolist() for i in keep
            ]
    boxes = sum(len(_stored(first, "boxes")[i]) // 24 for i in keep)
    assert result.target_stats["boxes"]["boxes"] == boxes
    assert result.target_stats["boxes"]["dropped"] == 0


def test_a_damaged_target_value_is_not_carried(
    packed: tuple[Catalog, Path], tmp_path: Path
) -> None:
    catalog, first = packed
    with h5py.File(first, "r") as h5:
        at = int(h5["targets/caption/values"].id.get_offset())
        start = int(h5["targets/caption/offsets"][3])
    data = bytearray(first.read_bytes())
    assert data[at + start : at + start + 11] == b"caption-003"
    data[at + start] = ord("C")  # row 3's caption changed; its digest not
    first.write_bytes(bytes(data))
    part = _rewrite(catalog, [1, 3, 5], tmp_path)
    reuse = Reuse(str(first), frozenset(s.relpath for s in part.samples), targets=True)
    with pytest.raises(IntegrityError, match=r"/targets/caption\[3\] has sha256"):
        pack_slice(part, tmp_path / "second.h5", config=CONFIG, workers=1, reuse=reuse)
    assert not (tmp_path / "second.h5").exists()


def test_a_file_of_other_target_columns_carries_nothing(
    packed: tuple[Catalog, Path], tmp_path: Path
) -> None:
    catalog, first = packed
    fewer = dataclasses.replace(
        catalog,
        schema=catalog.schema[1:],
        samples=tuple(dataclasses.replace(s, targets=s.targets[1:]) for s in catalog.samples),
    )
    reuse = Reuse(str(first), frozenset(s.relpath for s in fewer.samples), targets=True)
    result = pack_slice(fewer, tmp_path / "second.h5", config=CONFIG, workers=1, reuse=reuse)
    assert result.reused == 0  # every sample packed from its source, with its own columns
    assert result.num_samples == len(catalog.samples)
    with h5py.File(tmp_path / "second.h5", "r") as h5:
        assert sorted(h5["targets"]) == sorted(c.name for c in catalog.schema[1:])


def test_a_carried_value_breaking_its_rule_is_refused_at_the_seal(
    packed: tuple[Catalog, Path], tmp_path: Path
) -> None:
    """A box outside its image whose digest was made to match (a file someone else wrote):
    the digest check passes, the new file's seal checks the value's rule and refuses it."""
    import hashlib

    catalog, first = packed
    with h5py.File(first, "r+") as h5:
        offsets = h5["targets/boxes/offsets"][()].astype(np.int64)
        row = next(i for i in range(len(offsets) - 1) if offsets[i + 1] > offsets[i])
        box = h5["targets/boxes/values"][int(offsets[row])]
        box[2] = 1e6  # x2 far outside the 32-pixel-wide image
        h5["targets/boxes/values"][int(offsets[row])] = box
        blob = h5["targets/boxes/values"][int(offsets[row]) : int(offsets[row + 1])].tobytes()
        h5["targets/boxes/digests"][row] = np.frombuffer(hashlib.sha256(blob).digest(), np.uint8)
    part = _rewrite(catalog, [row], tmp_path)
    reuse = Reuse(str(first), frozenset(s.relpath for s in part.samples), targets=True)
    with pytest.raises(IntegrityError, match="failed verification") as e:
        pack_slice(part, tmp_path / "second.h5", config=CONFIG, workers=1, reuse=reuse)
    assert "/targets/boxes sample 0" in str(e.value.args)
    assert not (tmp_path / "second.h5").exists()


@pytest.mark.parametrize(
    ("config", "error"),
    [(CONFIG, "reused sample.* do not match"), (GZIP, "its targets are carried from that file")],
    ids=["copied", "filtered"],
)
def test_a_damaged_image_with_carried_targets_is_an_error(
    tmp_path: Path, config: PackConfig, error: str
) -> None:
    """Its targets are the previous file's, so it cannot be packed from source instead."""
    rows = sample_rows(4, seed=1)
    w = write_listing_with_columns(tmp_path / "src", rows)
    catalog = discover(w.root, listing=w.listing)
    first = tmp_path / "first.h5"
    pack_slice(catalog, first, config=config, workers=1)
    flip_sample_byte(first, 2)
    part = _rewrite(catalog, [1, 2], tmp_path)
    reuse = Reuse(str(first), frozenset(s.relpath for s in part.samples), targets=True)
    with pytest.raises(IntegrityError, match=error):
        pack_slice(part, tmp_path / "second.h5", config=config, workers=1, reuse=reuse)
    assert not (tmp_path / "second.h5").exists()
