"""The merge checks what it copies (each part file's sha256 against its sidecar, or every
sample's digest for parts without one); the seal then verifies structure only."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS, ImageConfig
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import pack_part
from h5forge.scale.plan import plan_parts
from h5forge.verify.checks import verify, verify_unsealed
from tests.fixtures.damage import flip_sample_byte

BUILDS: dict[str, dict[str, Any]] = {
    "raw": {"config": PackConfig(ImageConfig(resize="resize", size=(24, 32)))},
    "gzip": {
        "config": PackConfig(
            ImageConfig(resize="resize", size=(24, 32)), compression="gzip", compression_level=1
        ),
    },
    "lzf-fletcher32": {
        "config": PackConfig(
            ImageConfig(resize="resize", size=(24, 32)), compression="lzf", fletcher32=True
        ),
    },
    "blob": {"config": PackConfig(ImageConfig(layout="encoded", resize="none", size=None))},
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each build's parts (3 of 4 images) of a 2-class folder, packed in this process."""
    root = tmp_path_factory.mktemp("merge_src")
    write_image_folder(
        root,
        classes=("ant", "bee"),
        per_class=6,
        seed=5,
        size=((20, 50), (20, 50)),
        formats=("jpeg", "png"),
    )
    catalog = discover(root)
    specs = plan_parts(catalog, samples_per_part=4)
    out: dict[str, list[str]] = {}
    for name, kw in BUILDS.items():
        staging = tmp_path_factory.mktemp(f"staging_{name}")
        out[name] = [pack_part(catalog, s, str(staging), **kw).url for s in specs]
    return out


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_merge_checks_every_sample_and_the_output_verifies(
    build: str, parts: dict[str, list[str]], tmp_path: Path
) -> None:
    merged = merge_parts(parts[build], tmp_path / "m.h5", max_bad_fraction=0.0)
    assert merged.num_samples == 12
    report = verify(merged.path)  # the full verify: every digest and the file sha256
    assert report.checked_samples == 12


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_merge_refuses_a_part_damaged_after_packing(
    build: str, parts: dict[str, list[str]], tmp_path: Path
) -> None:
    urls = [shutil.copy(u, tmp_path / Path(u).name) for u in parts[build]]
    flip_sample_byte(Path(urls[1]), 2)
    with pytest.raises(IntegrityError, match=r"sample 6 \(sample 2 of .*part-00001\.h5\)"):
        merge_parts(urls, tmp_path / "out" / "m.h5", max_bad_fraction=0.0)
    assert not (tmp_path / "out" / "m.h5").exists()
    assert not (tmp_path / "out" / "m.h5.partial").exists()


def test_verify_unsealed_without_digests_still_checks_structure(
    parts: dict[str, list[str]], tmp_path: Path
) -> None:
    path = Path(shutil.copy(parts["raw"][0], tmp_path / "s.h5"))
    flip_sample_byte(path, 1)
    with pytest.raises(IntegrityError, match="sample 1: sha256"):
        verify_unsealed(str(path), max_pixels=DEFAULT_MAX_PIXELS)
    report = verify_unsealed(str(path), max_pixels=DEFAULT_MAX_PIXELS, check_digests=False)
    assert (report.num_samples, report.checked_samples) == (4, 0)
    with h5py.File(path, "r+") as h5:  # an index change: caught by the metadata digest
        h5["labels"][0] = np.int64(1 - h5["labels"][0])
    with pytest.raises(IntegrityError, match="metadata_sha256"):
        verify_unsealed(str(path), max_pixels=DEFAULT_MAX_PIXELS, check_digests=False)
