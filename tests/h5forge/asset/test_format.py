"""docs/FORMAT.md, h5forge/asset/format.py and what the writer writes must agree, field by field."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import pytest

from h5forge.asset import format as fmt
from h5forge.pack.writer import PackResult, pack
from tests.h5forge.pack.test_pack_targets import CONFIGS, SCHEMA, catalog, scene

FORMAT_MD = Path(__file__).resolve().parents[3] / "docs" / "FORMAT.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}")
    nxt = text.find("\n## ", start + 1)
    return text[start : nxt if nxt != -1 else None]


def _documented() -> tuple[set[str], set[str]]:
    text = FORMAT_MD.read_text(encoding="utf-8")
    datasets = set(re.findall(r"^\| `/([\w/]+)` \|", _section(text, "Datasets"), re.M))
    attrs = set(re.findall(r"^\| `(\w+)` \|", _section(text, "Root attributes"), re.M))
    return datasets, attrs


def _written(path: str) -> tuple[set[str], set[str]]:
    names: set[str] = set()
    with h5py.File(path) as h5:
        h5.visititems(lambda name, obj: names.add(name) if isinstance(obj, h5py.Dataset) else None)
        attrs = set(h5.attrs)
        for name in names:
            assert not h5[name].attrs, f"/{name} carries attributes FORMAT.md does not define"
    return names, attrs


def test_doc_and_module_list_the_same_fields() -> None:
    datasets, attrs = _documented()
    assert datasets == set(fmt.DATASET_DESCRIPTIONS)
    assert attrs == set(fmt.ATTR_DESCRIPTIONS)


@pytest.mark.parametrize("which", ["packed_decoded", "packed_encoded"])
def test_writer_writes_only_documented_fields(which: str, request: pytest.FixtureRequest) -> None:
    result: PackResult = request.getfixturevalue(which)
    datasets, attrs = _written(result.path)
    doc_datasets, doc_attrs = _documented()
    assert datasets <= doc_datasets, f"undocumented datasets: {datasets - doc_datasets}"
    # lineage: written only when a build passes it; targets_json: only in version 2
    doc_attrs -= fmt.OPTIONAL_ATTRS | {fmt.A_TARGETS_JSON}
    assert attrs == doc_attrs, f"undocumented {attrs - doc_attrs}, missing {doc_attrs - attrs}"
    with h5py.File(result.path) as h5:
        storage = h5.attrs["storage"]
        assert set(fmt.REQUIRED_DATASETS[storage]) == datasets
        assert h5.attrs["format"] == fmt.FORMAT_NAME
        assert h5.attrs["format_version"] == fmt.FORMAT_VERSION
        assert h5.attrs["sealed"]


def _targets_kinds() -> dict[str, list[str]]:
    """The per-kind table of FORMAT.md's version 2 section: kind -> its datasets."""
    text = _section(FORMAT_MD.read_text(encoding="utf-8"), "Format version 2")
    heads = ["values", "offsets", "shapes", "digests"]
    out = {}
    for row in re.findall(r"^\| `(\w+)` \|(.*)\|$", text, re.M):
        cells = [c.strip() for c in row[1].split("|")]
        out[row[0]] = [h for h, c in zip(heads, cells, strict=True) if c]
    return out


def test_doc_and_module_list_the_same_target_datasets() -> None:
    assert _targets_kinds() == {k: list(v) for k, v in fmt.TARGET_DATASETS.items()}


def test_a_version_2_file_holds_only_documented_fields(tmp_path: Path) -> None:
    path, mask = scene(tmp_path, "s", (40, 30), (4, 6, 20, 16))
    row = ((1,), ((4, 6, 20, 16, 0, 0),), str(mask), "a", 2.0)
    out = tmp_path / "v2.h5"
    pack(catalog(tmp_path, [(path, row)]), out, config=CONFIGS["encoded"], workers=1)
    datasets, attrs = _written(str(out))
    doc_datasets, doc_attrs = _documented()
    columns = {name.split("/")[1] for name in datasets if name.startswith("targets/")}
    assert columns == {c.name for c in SCHEMA}
    generic = {re.sub(r"^targets/\w+/", "targets/NAME/", name) for name in datasets}
    assert generic <= doc_datasets, f"undocumented datasets: {generic - doc_datasets}"
    assert attrs == doc_attrs - fmt.OPTIONAL_ATTRS
    with h5py.File(out) as h5:
        assert h5.attrs["format_version"] == fmt.TARGETS_VERSION
        for c in SCHEMA:
            assert sorted(h5[f"targets/{c.name}"]) == sorted(fmt.TARGET_DATASETS[c.kind])
