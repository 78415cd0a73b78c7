"""The library CLI (pack, verify, inspect) as a user runs it: a subprocess, with exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from PIL import Image

from h5forge.demo import write_image_folder


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "h5forge.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_src")
    write_image_folder(root, classes=("x", "y"), per_class=4, seed=3, size=(30, 40))
    return root


def test_pack_verify_inspect(small_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    r = _cli("pack", str(small_tree), str(out), "--size", "16x24", "--resize", "resize",
             "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "8 samples, 2 classes, 0 quarantined" in r.stdout
    r = _cli("verify", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_samples"] == 8
    png = tmp_path / "grid.png"
    r = _cli("inspect", str(out), "--preview", str(png), "--n", "4")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert info["counts"] == {"": {"x": 4, "y": 4}}
    assert info["sealed"] is True
    with Image.open(png) as im:
        assert im.format == "PNG"
        assert im.width >= 2 * 16


def test_integrity_failure_exits_1(small_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    assert _cli("pack", str(small_tree), str(out), "--workers", "1", "--size", "16").returncode == 0
    with h5py.File(out, "r+") as h5:
        h5["labels"][0] = 7
    r = _cli("verify", str(out))
    assert r.returncode == 1
    assert "label 7 out of range" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [
    ["pack", "/nonexistent/dir", "x.h5"],
    ["pack", ".", "x.h5", "--size", "abc"],
    ["verify"],
    ["pack", ".", "x.h5", "--compression", "brotli"],
])
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    r = _cli(*[a.replace("x.h5", str(tmp_path / "x.h5")) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
