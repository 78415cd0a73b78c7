"""From Python, a sample's source path and the asset's provenance: ``ds.source_path(i)``,
``ds.sources`` and ``ds.provenance`` on ``H5ImageDataset``, read from the file itself."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.release import publish_version
from h5forge.read.dataset import H5ImageDataset

_SOURCE_URL = "https://example.org/pets.tar.gz"
_CONFIG = PackConfig(ImageConfig(resize="none", size=None))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PackResult]:
    tmp = tmp_path_factory.mktemp("provenance")
    root = tmp / "src"
    write_image_folder(
        root,
        classes=("cat", "dog"),
        per_class=3,
        splits=("train", "val"),
        size=((20, 30), (20, 30)),
        formats=("png",),  # lossless: a sample's pixels are its source file's, exactly
    )
    result = pack(root, tmp / "pets.h5", config=_CONFIG, workers=1, source_url=_SOURCE_URL)
    return root, result


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


@pytest.mark.parametrize("split", [None, "val"])
def test_each_sample_names_the_file_it_came_from(
    packed: tuple[Path, PackResult], split: str | None
) -> None:
    root, result = packed
    ds = H5ImageDataset(result.path, split=split)
    assert len(ds.sources) == len(ds) == (12 if split is None else 6)
    for i in range(len(ds)):
        path = ds.source_path(i)
        assert path == ds.sources[i]
        image, label = ds[i]
        assert np.array_equal(np.asarray(image), _pixels(root / path)), path
        assert path.split("/")[-2] == ds.classes[label]
        if split is not None:
            assert path.startswith(f"{split}/")
    assert ds.source_path(-1) == ds.sources[-1]
    with pytest.raises(IndexError):
        ds.source_path(len(ds))


def test_provenance_says_where_and_how_the_asset_was_made(
    packed: tuple[Path, PackResult],
) -> None:
    _, result = packed
    got = H5ImageDataset(result.path).provenance
    assert got["url"] == str(result.path)
    assert got["sha256"] == ""  # opened by its file name, not as a version
    assert got["source_url"] == _SOURCE_URL
    assert got["config"] == json.loads(_CONFIG.to_json())
    assert got["h5forge_version"]
    assert got["created_at"].endswith("+00:00")
    assert got["parent_sha256"] == ""
    assert got["changes"] is None


def test_a_version_and_a_pickled_copy_know_them_too(
    packed: tuple[Path, PackResult], tmp_path: Path
) -> None:
    _, result = packed
    published = publish_version(result.path, Location(str(tmp_path / "pets.h5")))
    ds = H5ImageDataset(str(tmp_path / "pets"), version="latest")
    assert ds.provenance["sha256"] == published.sha256
    assert ds.provenance["url"] == published.url
    ds.source_path(0)  # loaded here; a worker's copy reads its own
    clone = pickle.loads(pickle.dumps(ds))
    assert "_sources_loaded" not in clone.__dict__
    assert clone.sources == ds.sources
    assert clone.provenance == ds.provenance
