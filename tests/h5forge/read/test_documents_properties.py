"""Property tests of the reader's untrusted documents (issue 28): the asset list, a list of
sources, and the resume states of :class:`Sampler`, :class:`Loader` and
:class:`MixingSampler`. Any input of bounded size gives a result or the reader's one
documented error (``ValueError``; ``DocumentError`` is one), never another exception, never a
hang."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.asset_list import (
    ASSET_LIST_FORMAT,
    MAX_ASSETS,
    AssetSource,
    parse_sources,
    read_asset_list,
)
from h5forge.read.loader import batch_loader
from h5forge.read.mixing import MixingSampler
from h5forge.read.multi import H5MultiDataset
from h5forge.read.provenance import PROVENANCE_ATTRS, read_provenance
from h5forge.read.sampler import Sampler
from tests.fixtures.documents import (
    JSON_VALUES,
    NUMBERS,
    POSITIVE,
    attempt,
    document_text,
    examples,
    mutated,
    place,
    placed_documents,
)

ASSET_LIST = {
    "format": ASSET_LIST_FORMAT,
    "version": 1,
    "assets": [
        {"url": "s3://bucket/flowers", "version": "latest", "weight": 2.0},
        {"url": "part-0001.h5"},
        {"url": "/data/x.h5", "version": "ab" * 8, "weight": 1},
    ],
}
SAMPLER_STATE = {
    "epoch": 2,
    "position": 5,
    "n": 10,
    "seed": 0,
    "shuffle": True,
    "block_size": None,
    "window": 4,
}


def _checked_sources(found: list[AssetSource]) -> None:
    assert 1 <= len(found) <= MAX_ASSETS
    for s in found:
        assert isinstance(s.url, str)
        assert s.url
        assert s.version is None or isinstance(s.version, str)
        assert isinstance(s.weight, float)
        assert np.isfinite(s.weight)
        assert s.weight > 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("read-documents")


@examples(100)
@given(content=placed_documents(ASSET_LIST))
def test_an_asset_list_reads_or_raises_value_error(folder: Path, content: bytes | str) -> None:
    where = folder / "assets.json"
    place(where, content)
    found, error = attempt(lambda: read_asset_list(Location(str(where))), ValueError)
    if error is not None:
        assert str(where) in str(error)  # the message names the list
        return
    _checked_sources(found)


_SOURCE_ITEMS = (
    JSON_VALUES
    | mutated(ASSET_LIST["assets"][0])
    | st.tuples(JSON_VALUES, JSON_VALUES)
    | st.builds(Path, st.text(min_size=1, max_size=8))
)


@examples(100)
@given(sources=st.lists(_SOURCE_ITEMS, max_size=6).map(lambda x: x) | JSON_VALUES)
def test_a_list_of_sources_parses_or_raises_value_error(sources: Any) -> None:
    found, error = attempt(lambda: parse_sources(sources), ValueError)
    if error is not None:
        return
    _checked_sources(found)


@examples(100)
@given(state=mutated(SAMPLER_STATE) | JSON_VALUES, n=st.sampled_from([10, 10, 10, 0, 3]))
def test_a_sampler_state_loads_or_raises_value_error(state: Any, n: int) -> None:
    sampler = Sampler(n, rank=0, world_size=2)
    _, error = attempt(lambda: sampler.load_state_dict(state), ValueError)
    if error is not None:
        return
    got = list(sampler)  # a loaded state is one this sampler can continue from
    assert all(0 <= i < n for i in got)


@examples(100)
@given(
    state=mutated({"sampler": SAMPLER_STATE, "batches": 1}) | JSON_VALUES,
    own_sampler=st.booleans(),
)
def test_a_loader_state_loads_or_raises_value_error(state: Any, own_sampler: bool) -> None:
    data = list(range(10))
    loader = batch_loader(
        data,
        lambda indices: indices,
        3,
        shuffle=False,
        sampler=None if own_sampler else range(10),
        drop_last=False,
        generator=None,
    )
    _, error = attempt(lambda: loader.load_state_dict(state), ValueError)
    if error is not None:
        return
    for batch in loader:
        assert all(0 <= i < 10 for i in batch)


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> H5MultiDataset:
    tmp = tmp_path_factory.mktemp("mixing")
    urls = []
    for k in range(2):
        src = tmp / f"src{k}"
        write_image_folder(src, classes=("a", "b"), per_class=2, seed=k, size=(8, 8))
        config = PackConfig(ImageConfig(resize="resize", size=(8, 8)))
        urls.append(pack(src, tmp / f"{k}.h5", config=config, workers=1).path)
    (tmp / "assets.json").write_text(
        json.dumps({"format": ASSET_LIST_FORMAT, "version": 1, "assets": urls})
    )
    return H5MultiDataset(urls)


@examples(30)
@given(epoch=NUMBERS | JSON_VALUES)
def test_a_mixing_epoch_is_taken_or_raises_value_error(multi: H5MultiDataset, epoch: Any) -> None:
    mix = MixingSampler(multi, seed=1)
    _, error = attempt(lambda: mix.set_epoch(epoch), ValueError)
    if error is not None:
        return
    got = list(mix)
    assert len(got) == len(mix)
    assert all(0 <= i < len(multi) for i in got)


@examples(100)
@given(
    weights=st.none()
    | st.lists(POSITIVE, min_size=2, max_size=2)
    | st.lists(POSITIVE | JSON_VALUES, min_size=1, max_size=3),
    length=st.none() | POSITIVE | NUMBERS,
    seed=POSITIVE | NUMBERS,
)
def test_mixing_parameters_are_taken_or_raise_value_error(
    multi: H5MultiDataset, weights: Any, length: Any, seed: Any
) -> None:
    # The weights come from an asset list (untrusted); length and seed from a saved job.
    mix, error = attempt(
        lambda: MixingSampler(multi, weights=weights, length=length, seed=seed), ValueError
    )
    if error is not None:
        return
    assert int(mix.quota.sum()) == mix.length == len(mix)
    assert (mix.quota >= 0).all()
    if mix.length <= 1000:  # a length is the caller's to choose: a huge one is a huge epoch
        got = mix.schedule(0)
        assert all(0 <= i < len(multi) for i in got.tolist())


_ATTR_VALUES = (
    document_text(json.loads(PackConfig().to_json()))
    | document_text({"added": 1, "removed": 0})
    | st.binary(max_size=64)
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.lists(st.integers(-(2**31), 2**31), min_size=1, max_size=4).map(np.array)
)


@examples(100)
@given(
    attrs=st.dictionaries(
        st.sampled_from([*PROVENANCE_ATTRS, "config_json", "changes_json"]), _ATTR_VALUES
    )
)
def test_provenance_reads_whatever_a_file_holds(attrs: dict[str, Any]) -> None:
    # read_provenance never raises: an attribute that is not text is shown as text, a JSON
    # one that is not JSON as None (``h5forge verify`` reports a damaged file).
    with h5py.File(io.BytesIO(), "w") as h5:
        for key, value in attrs.items():
            try:
                h5.attrs[key] = value
            except (TypeError, ValueError):  # not storable (a lone surrogate): skip it
                continue
        found = read_provenance(h5)
    assert set(found) == {*PROVENANCE_ATTRS, "config", "changes"}
    assert all(isinstance(found[k], str) for k in PROVENANCE_ATTRS)
