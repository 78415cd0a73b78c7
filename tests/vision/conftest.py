"""tests/vision runs where torchvision imports (``make test-vision`` builds .venv-vision with
torch 2.14.1 and torchvision 0.29.1); elsewhere every test here is skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from tests.vision.scenes import write_scenes

W, H = 64, 48


@pytest.fixture(scope="session")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """Eight packed scenes (decoded, one size: the reader's batch path) and their raw values."""
    root = tmp_path_factory.mktemp("vision-scenes")
    catalog, raws = write_scenes(root / "src", 8, size=(W, H))
    out = root / "scenes.h5"
    pack(catalog, out, config=PackConfig(ImageConfig(resize="resize", size=(H, W))), workers=1)
    return out, raws
