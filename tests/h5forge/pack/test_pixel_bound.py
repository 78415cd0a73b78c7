"""A pack given a raised ``max_image_pixels`` seals, merges and reads back what it packed.

Every check of a file the writer has just made (the seal's own verification, the part merge's,
the smoke-load, the preview) takes the decode bound from the configuration in hand, never the
default and never the file: an image above Pillow's default bound, packed with a raised one,
must not be refused by the pack's own checks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from h5forge.discover.catalog import discover
from h5forge.errors import IntegrityError, TooManyBadImagesError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS, ImageConfig
from h5forge.publish.preview import write_preview
from h5forge.read.dataset import H5ImageDataset
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import pack_part
from h5forge.scale.plan import plan_parts
from h5forge.smoke.load import smoke_load
from h5forge.verify.checks import verify
from tests.fixtures.images import BIG_SIDE as SIDE
from tests.fixtures.images import RAISED_MAX_PIXELS as RAISED
from tests.fixtures.images import big_image_tree


def raised_config(max_image_pixels: int = RAISED) -> PackConfig:
    """Stored as sent (encoded, original bytes, no resize), so the big image stays big."""
    return PackConfig(
        ImageConfig(
            layout="encoded",
            encoding="original",
            resize="none",
            size=None,
            mode="L",
            max_image_pixels=max_image_pixels,
        )
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return big_image_tree(tmp_path_factory.mktemp("big_src"))


def _read_back(path: str) -> None:
    """The file verifies and reads back with the raised bound, and only with it."""
    assert verify(path, max_pixels=RAISED).num_samples == 2
    ds = H5ImageDataset(path, max_pixels=RAISED)
    sizes = sorted(tuple(ds[i][0].shape) for i in range(len(ds)))
    assert sizes == [(1, 16, 16), (1, SIDE, SIDE)]
    with pytest.raises(IntegrityError, match=f"more than max_pixels={DEFAULT_MAX_PIXELS}"):
        H5ImageDataset(path)  # a reader's default stays the default: the file raises nothing


def test_pack_with_a_raised_bound_seals_and_reads_back(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "big.h5"
    result = pack(tree, out, config=raised_config(), workers=1)
    assert (result.num_samples, result.quarantined) == (2, ())
    _read_back(str(out))
    assert smoke_load(str(out), workers=0, max_pixels=RAISED).samples_checked == 2
    png = tmp_path / "preview.png"
    write_preview(str(out), str(png), n=2, max_pixels=RAISED)
    with Image.open(png) as grid:
        assert grid.size[0] > 0


def test_pack_with_the_default_bound_quarantines_the_big_image(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(TooManyBadImagesError, match=r"big/big\.jpg: image too large"):
        pack(tree, tmp_path / "default.h5", config=raised_config(DEFAULT_MAX_PIXELS), workers=1)


def test_merge_of_parts_packed_with_a_raised_bound_seals(tree: Path, tmp_path: Path) -> None:
    catalog = discover(tree)
    config = raised_config()
    urls = [
        pack_part(catalog, spec, str(tmp_path / "staging"), config=config).url
        for spec in plan_parts(catalog, samples_per_part=1)
    ]
    merged = merge_parts(urls, tmp_path / "m.h5", max_bad_fraction=0.0, max_pixels=RAISED)
    assert merged.num_samples == 2
    _read_back(merged.path)


def test_cli_pack_with_a_raised_bound_seals_and_reads_back(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.h5"
    r = subprocess.run(
        [
            *(sys.executable, "-m", "h5forge.cli", "pack", str(tree), str(out)),
            *("--layout", "encoded", "--encoding", "original", "--resize", "none"),
            *("--mode", "L", "--max-image-pixels", str(RAISED), "--workers", "1"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    _read_back(str(out))
