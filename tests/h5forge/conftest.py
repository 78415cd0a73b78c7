"""Fixtures for the writer, verifier and reader tests: small real image folders, packed."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5forge.demo import write_image_folder
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from tests.fixtures.hostile_h5 import build_bases


@pytest.fixture(scope="session")
def split_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/val ImageFolder with 3 classes of JPEG and PNG files of mixed sizes."""
    root = tmp_path_factory.mktemp("split_tree")
    write_image_folder(
        root,
        classes=("cat", "dog", "eel"),
        per_class=6,
        splits=("train", "val"),
        seed=7,
        size=((40, 70), (30, 90)),
        formats=("jpeg", "png"),
    )
    return root


@pytest.fixture(scope="session")
def packed_decoded(split_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    out = tmp_path_factory.mktemp("packed") / "decoded.h5"
    return pack(
        split_tree, out, config=PackConfig(ImageConfig(resize="resize", size=(32, 48))), workers=2
    )


@pytest.fixture(scope="session")
def packed_encoded(split_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    out = tmp_path_factory.mktemp("packed") / "encoded.h5"
    return pack(
        split_tree,
        out,
        config=PackConfig(
            ImageConfig(layout="encoded", encoding="original", resize="none", size=None)
        ),
        workers=2,
    )


@pytest.fixture(scope="session")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One 9-image folder packed decoded, encoded, varsize, gzip, blosc-lz4 and zstd."""
    return build_bases(tmp_path_factory.mktemp("bases"))
