"""Hostile target columns: what the reader's open and verify refuse in a format version 2 file.

Each case starts from a real packed file and alters it with h5py, as someone handing out a
file could."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.errors import IntegrityError, UnsealedFileError
from h5forge.pack.writer import pack
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.h5forge.pack.test_pack_targets import CONFIGS, catalog, scene


def _good(folder: Path, layout: str) -> Path:
    rows = []
    for k in range(3):
        rect = (2 * k, 2, 2 * k + 10, 12)
        path, mask = scene(folder, f"s{k}", (40, 30), rect)
        rows.append(
            (path, (tuple(sorted({0, k % 3})), ((*rect, 1, 0),), str(mask), f"caption {k}", k / 4))
        )
    out = folder / f"{layout}.h5"
    pack(catalog(folder, rows), out, config=CONFIGS[layout], workers=1)
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile-targets")
    return {layout: _good(folder, layout) for layout in CONFIGS}


def _altered(good: dict[str, Path], tmp_path: Path, change: Callable, layout: str) -> Path:
    path = tmp_path / "altered.h5"
    shutil.copyfile(good[layout], path)
    with h5py.File(path, "r+") as h5:
        change(h5)
    return path


def _recreate(name: str, **kwargs: object) -> Callable[[h5py.File], None]:
    def change(h5: h5py.File) -> None:
        data = h5[name][()]
        del h5[name]
        h5.create_dataset(name, data=kwargs.pop("astype", lambda d: d)(data), **kwargs)  # type: ignore[operator]

    return change


def _extra_column(h5: h5py.File) -> None:
    g = h5.create_group("targets/extra")
    for name in ("values", "offsets", "digests"):
        g.create_dataset(name, data=h5[f"targets/tags/{name}"][()])


def _set(name: str, index: object, value: object) -> Callable[[h5py.File], None]:
    def change(h5: h5py.File) -> None:
        data = h5[name][()]
        data[index] = value
        h5[name][...] = data

    return change


def _attr(name: str, value: object) -> Callable[[h5py.File], None]:
    def change(h5: h5py.File) -> None:
        if value is None:
            del h5.attrs[name]
        else:
            h5.attrs[name] = value

    return change


def _version_1_with_targets(h5: h5py.File) -> None:
    h5.attrs[fmt.A_VERSION] = 1
    del h5.attrs[fmt.A_TARGETS_JSON]


def _soft_link(h5: h5py.File) -> None:
    del h5["targets/caption/values"]
    h5["targets/caption/values"] = h5py.SoftLink("/targets/seg/values")


def _external(tmp: Path) -> Callable[[h5py.File], None]:
    def change(h5: h5py.File) -> None:
        data = h5["targets/caption/values"][()]
        del h5["targets/caption/values"]
        (tmp / "secret").write_bytes(bytes(len(data)))
        h5.create_dataset(
            "targets/caption/values", shape=data.shape, dtype=data.dtype,
            external=[(str(tmp / "secret"), 0, len(data))],
        )  # fmt: skip

    return change


CASES = {
    "extra column": (_extra_column, r"extra: \['extra'\]"),
    "missing column": (lambda h5: h5.__delitem__("targets/score"), r"missing: \['score'\]"),
    "extra dataset": (
        lambda h5: h5.create_dataset("targets/tags/shapes", data=np.zeros((3, 2), np.uint32)),
        "a multilabel column holds exactly",
    ),
    "wrong values dtype": (
        _recreate("targets/tags/values", astype=lambda d: d.astype(np.int64)),
        "has type <i8, expected <i4",
    ),
    "big-endian boxes": (
        _recreate("targets/boxes/values", astype=lambda d: d.astype(">f4")),
        "has type >f4, expected <f4",
    ),
    "chunked values": (_recreate("targets/caption/values", chunks=True), "chunked or filtered"),
    "compressed values": (
        _recreate("targets/caption/values", compression="gzip"),
        "chunked or filtered",
    ),
    "offsets rows": (
        _recreate("targets/tags/offsets", astype=lambda d: d[:-1]),
        r"offsets is \(3,\) uint64, expected \(4,\)",
    ),
    "offsets backwards": (_set("targets/caption/offsets", 1, 20), "goes backwards at sample 1"),
    "offsets past the end": (_set("targets/caption/offsets", -1, 10**6), "ends at 1000000"),
    "offsets from 1": (_set("targets/caption/offsets", 0, 1), r"offsets\[0\] = 1, expected 0"),
    "mask of another size": (
        _set("targets/seg/shapes", 1, (15, 21)),
        r"shapes\[1\] = \(15, 21\), its image is \(15, 20\)",
    ),
    "too many boxes per sample": (
        _set("targets/tags/offsets", slice(1, None), (4, 5, 5)),
        "sample 0 has 4 rows, a multilabel value has at most 3",
    ),
    "number rows": (
        _recreate("targets/score/values", astype=lambda d: d[:2]),
        "has 2 rows, num_samples says 3",
    ),
    "soft link": (_soft_link, "soft link"),
    "targets_json garbage": (_attr(fmt.A_TARGETS_JSON, "{not json"), "not a valid target schema"),
    "targets_json unknown kind": (
        _attr(fmt.A_TARGETS_JSON, '[{"name": "tags", "kind": "polygon"}]'),
        "kind 'polygon' is not one of",
    ),
    "targets_json empty": (_attr(fmt.A_TARGETS_JSON, "[]"), "lists no column"),
    "version 1 with /targets": (_version_1_with_targets, "/targets in a version 1 file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reader_refuses_a_hostile_target_column(good, tmp_path, case):
    change, message = CASES[case]
    path = _altered(good, tmp_path, change, "decoded")
    with pytest.raises(IntegrityError, match=message):
        H5ImageDataset(path)
    with pytest.raises(IntegrityError, match=message):
        verify(str(path))


def test_values_in_external_storage_are_refused_before_any_read(good, tmp_path):
    path = _altered(good, tmp_path, _external(tmp_path), "decoded")
    with pytest.raises(IntegrityError, match="external file"):
        H5ImageDataset(path)


def test_version_2_without_its_schema_is_refused(good, tmp_path):
    path = _altered(good, tmp_path, _attr(fmt.A_TARGETS_JSON, None), "decoded")
    with pytest.raises(UnsealedFileError, match="version 2 exactly when it has target columns"):
        H5ImageDataset(path)


def test_a_changed_target_byte_fails_its_digest_and_nothing_else(good, tmp_path):
    """The values are not covered by metadata_sha256 but by their column's digests."""
    path = _altered(good, tmp_path, _set("targets/caption/values", 3, ord("X")), "decoded")
    H5ImageDataset(path)  # the open reads no target value
    with pytest.raises(IntegrityError) as info:
        verify(str(path))
    assert [line.split(":")[0] for line in info.value.failures] == ["/targets/caption sample 0"]
    assert "does not match its digest" in info.value.failures[0]


def _forged(name: str, index: object, value: object) -> Callable[[h5py.File], None]:
    """Change a value, then its digest and metadata_sha256: only the content rules catch it."""

    def change(h5: h5py.File) -> None:
        _set(f"targets/{name}/values", index, value)(h5)
        off = h5[f"targets/{name}/offsets"][()] if "offsets" in h5[f"targets/{name}"] else None
        values = h5[f"targets/{name}/values"]
        a, b = (0, 1) if off is None else (int(off[0]), int(off[1]))
        digest = hashlib.sha256(values[a:b].tobytes()).digest()
        _set(f"targets/{name}/digests", 0, np.frombuffer(digest, np.uint8))(h5)
        h5.attrs[fmt.A_METADATA_SHA256] = metadata_sha256(h5)

    return change


FORGED = {
    "box not finite": ("decoded", _forged("boxes", (0, 2), np.nan), "box 0 .* is not finite"),
    "box outside": ("decoded", _forged("boxes", (0, 2), 99.0), "inside the 20 x 15 image"),
    "class out of range": ("decoded", _forged("tags", 0, 7), r"not sorted, distinct, in 0..2"),
    "text not utf-8": ("decoded", _forged("caption", 0, 0xFF), "text is not UTF-8"),
    "text NUL": ("decoded", _forged("caption", 0, 0), "NUL"),
    "number nan": ("decoded", _forged("score", 0, np.inf), "is not finite"),
    "png mask": ("encoded", _forged("seg", 40, 0x55), "mask does not decode"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_verify_checks_each_value_against_its_rule(good, tmp_path, case):
    layout, change, message = FORGED[case]
    path = _altered(good, tmp_path, change, layout)
    with pytest.raises(IntegrityError) as info:
        verify(str(path))
    assert len(info.value.failures) == 1, info.value.failures
    assert info.value.failures[0].startswith("/targets/")
    assert re.search(message, info.value.failures[0]), info.value.failures[0]


@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_a_good_version_2_file_verifies(good, layout):
    report = verify(str(good[layout]))
    assert report.format_version == fmt.TARGETS_VERSION
    assert report.checked_samples == 3
