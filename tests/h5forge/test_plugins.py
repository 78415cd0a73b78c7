"""Plugin codecs (Blosc-LZ4, Zstd) read everywhere when hdf5plugin is installed, and say which
extra to install when it is not (provoked for real: a fresh interpreter where the import fails
and HDF5_PLUGIN_PATH names an empty folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from h5forge.location import Location
from h5forge.read.dataset import H5ImageDataset
from h5forge.smoke.load import smoke_load
from h5forge.summary import summarize
from h5forge.verify.checks import verify

REPO = Path(__file__).resolve().parents[2]
PLUGINS = ("blosc-lz4", "zstd")
_BLOCK = "import sys; sys.modules['hdf5plugin'] = None\n"


def _pixels(path: Path) -> list[tuple[torch.Tensor, int]]:
    ds = H5ImageDataset(path)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("codec", PLUGINS)
def test_plugin_file_verifies_inspects_and_reads(codec: str, bases: dict[str, Path]) -> None:
    path = bases[codec]
    report = verify(str(path))
    assert report.checked_samples == report.num_samples == 9
    info = summarize(Location(str(path)))
    assert info["attributes"]["compression"] == codec
    assert sum(info["counts"][""].values()) == 9
    got, want = _pixels(path), _pixels(bases["decoded"])  # same images, uncompressed
    assert [label for _, label in got] == [label for _, label in want]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want, strict=True))
    assert smoke_load(str(path), workers=0, batches=1, batch_size=4).samples_checked > 0


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
@pytest.mark.parametrize("codec", PLUGINS)
def test_plugin_file_loads_through_loader_workers(
    codec: str, method: str, bases: dict[str, Path]
) -> None:
    ds = H5ImageDataset(bases[codec])
    want = _pixels(bases["decoded"])
    seen = []
    for images, labels in ds.loader(4, num_workers=2, multiprocessing_context=method):
        seen += list(zip(images, labels.tolist(), strict=True))
    assert len(seen) == len(want)
    assert all(torch.equal(a, b) and la == lb for (a, la), (b, lb) in zip(seen, want, strict=True))


_TRIAL = (
    _BLOCK
    + """
import json, sys
try:
    import hdf5plugin
except ImportError:
    blocked = True
else:
    blocked = False
from h5forge.location import Location
from h5forge.read.dataset import H5ImageDataset
from h5forge.summary import summarize
from h5forge.verify.checks import verify
out = {"blocked": blocked}
def inspect(url):
    return summarize(Location(url))
for name, call in (("reader", H5ImageDataset), ("verify", verify), ("inspect", inspect)):
    try:
        call(sys.argv[1])
        out[name] = ["opened", ""]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""
)


def _env(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "no-plugins"
    empty.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(REPO), "HDF5_PLUGIN_PATH": str(empty)}


@pytest.mark.parametrize("codec", PLUGINS)
def test_missing_plugin_names_the_extra(codec: str, bases: dict[str, Path], tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _TRIAL, str(bases[codec])],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("blocked") is True
    filter_name = {"blosc-lz4": "blosc", "zstd": "zstd"}[codec]
    for entry, (kind, message) in out.items():
        assert kind == "MissingExtraError", (entry, kind, message)
        assert "/images is compressed with the HDF5 filter" in message
        assert filter_name in message.lower()
        assert "pip install 'h5forge[plugins]'" in message


def test_missing_plugin_through_the_cli(bases: dict[str, Path], tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCK)
    env = _env(tmp_path)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{site}"
    for command in ("verify", "inspect"):
        r = subprocess.run(
            [sys.executable, "-m", "h5forge.cli", command, str(bases["blosc-lz4"])],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        # 2 today (MissingExtraError is an environment problem the user fixes, like usage);
        # never 0, never a traceback.
        assert r.returncode in (1, 2), (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert "pip install 'h5forge[plugins]'" in r.stderr


def test_hdf5plugin_is_imported_only_for_files_that_need_it(bases: dict[str, Path]) -> None:
    code = (
        "import sys\nfrom h5forge.read.dataset import H5ImageDataset\n"
        "H5ImageDataset(sys.argv[1])[0]\nprint('hdf5plugin' in sys.modules)\n"
        "H5ImageDataset(sys.argv[2])[0]\nprint('hdf5plugin' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(bases["gzip"]), str(bases["zstd"])],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"]


def test_cli_verifies_and_inspects_a_plugin_file(bases: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for command in ("verify", "inspect"):
        r = subprocess.run(
            [sys.executable, "-m", "h5forge.cli", command, str(bases["zstd"])],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (command, r.stderr)
        assert "Traceback" not in r.stderr
    assert "zstd" in r.stdout  # the summary names the codec (in whatever format inspect prints)
