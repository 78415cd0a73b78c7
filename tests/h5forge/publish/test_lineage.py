"""Lineage root attributes: written by pack only when given, covered by metadata_sha256."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest

from h5forge.asset import format as fmt
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.verify.checks import verify

LINEAGE = {
    "parent_sha256": "ab" * 32,
    "source_fingerprint": "cd" * 32,
    "flow_run_id": "0b8f6c3e-1f5e-4d16-9f4c-1f2e3d4c5b6a",
    "changes_json": json.dumps({"added": 2, "removed": 1, "replaced": 0}),
}
_CONFIG = PackConfig(ImageConfig(resize="resize", size=(16, 16)))


def test_pack_writes_the_lineage_attributes_and_verify_covers_them(
    split_tree: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lineage.h5"
    pack(split_tree, out, config=_CONFIG, workers=1, lineage=LINEAGE)
    with h5py.File(out) as h5:
        assert {k: h5.attrs[k] for k in LINEAGE} == LINEAGE
    assert verify(str(out)).checked_samples > 0
    with h5py.File(out, "r+") as h5:  # a changed lineage no longer matches metadata_sha256
        h5.attrs.modify(fmt.A_FLOW_RUN_ID, "0" * len(LINEAGE["flow_run_id"]))
    with pytest.raises(IntegrityError, match="metadata"):
        verify(str(out))


def test_a_file_packed_without_lineage_has_none(packed_decoded: PackResult) -> None:
    with h5py.File(packed_decoded.path) as h5:
        assert not fmt.OPTIONAL_ATTRS & set(h5.attrs)


@pytest.mark.parametrize(
    ("lineage", "match"),
    [
        ({"parent": "x"}, "unknown"),
        ({"parent_sha256": "AB" * 32}, "64 lower-case hex"),
        ({"source_fingerprint": "12"}, "64 lower-case hex"),
        ({"changes_json": "[1]"}, "JSON object of counts"),
        ({"flow_run_id": 5}, "must be a string"),
    ],
)
def test_bad_lineage_is_refused_before_a_file_is_written(
    split_tree: Path, tmp_path: Path, lineage: dict[str, object], match: str
) -> None:
    out = tmp_path / "bad.h5"
    with pytest.raises(ValueError, match=match):
        pack(split_tree, out, config=_CONFIG, workers=1, lineage=lineage)  # type: ignore[arg-type]
    assert not out.exists()
