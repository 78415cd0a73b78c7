"""The library CLI (pack, verify, inspect) as a user runs it: a subprocess, with exit codes.

Exit codes (README): 0 success, 1 integrity or run failure, 2 usage. Every class of error of
every command is provoked here for real: a flipped label, a sidecar that contradicts its file,
a destination that exists, is inside the source, read-only (a read-only bind mount) or full (a
tiny tmpfs), a source that is not there, names holding terminal escape sequences.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from PIL import Image

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.publish.sidecar import sidecar_url
from h5forge.publish.storage import publish
from h5forge.summary import summarize
from tests.fixtures.mounts import in_mounts

_PY = [sys.executable, "-m", "h5forge.cli"]


def _run(command: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=cwd, check=False
    )


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run([*_PY, *args], cwd=cwd)


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert errors, (r.stdout, r.stderr)
    return errors[0]


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_src")
    write_image_folder(root, classes=("x", "y"), per_class=4, seed=3, size=(30, 40))
    return root


@pytest.fixture(scope="module")
def packed(small_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli_packed") / "o.h5"
    pack(small_tree, out, workers=1)
    return out


def test_pack_verify_inspect(small_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    r = _cli(
        "pack", str(small_tree), str(out), "--size", "16x24", "--resize", "resize", "--workers", "1"
    )
    assert r.returncode == 0, r.stderr
    assert "8 samples, 2 classes, 0 quarantined" in r.stdout
    r = _cli("verify", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_samples"] == 8
    png = tmp_path / "grid.png"
    r = _cli("inspect", str(out), "--json", "--preview", str(png), "--n", "4")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
    assert info["counts"] == {"": {"x": 4, "y": 4}}
    assert info["sealed"] is True
    # Today's shape, whole, and the version it read ("" for a file opened by its name).
    assert info == {**json.loads(json.dumps(summarize(Location(str(out))))), "version": ""}
    with Image.open(png) as im:
        assert im.format == "PNG"
        assert im.width >= 2 * 16


def test_pack_progress_bar_shows_count_elapsed_and_rate(small_tree: Path, tmp_path: Path) -> None:
    r = _cli("pack", str(small_tree), str(tmp_path / "o.h5"), "--workers", "1", "--size", "16")
    assert r.returncode == 0, r.stderr
    # The last state of the bar (what a log keeps): done/total, elapsed time, rate.
    assert re.search(r"pack .* 8/8 \d+:\d\d:\d\d [\d,]+ img/s", r.stdout), r.stdout


def test_inspect_prints_a_readable_summary(packed: Path) -> None:
    r = _cli("inspect", str(packed))
    assert r.returncode == 0, r.stderr
    info = summarize(Location(str(packed)))
    lines = r.stdout.splitlines()
    assert f"size:         {packed.stat().st_size:,} bytes" in lines
    assert "samples:      8 in 2 classes, 0 quarantined" in lines
    assert "  (all): 8 (x 4, y 4)" in lines
    assert "sealed:       yes" in lines
    # The config is indented key: value lines, not a JSON string.
    config = json.loads(info["config"])
    assert "config:" in lines
    assert f"  compression: {config['compression']}" in lines
    assert "  image:" in lines
    assert f"    layout: {config['image']['layout']}" in lines
    assert f"    size: {json.dumps(config['image']['size'])}" in lines
    assert "quarantined:  0" in lines
    assert '{"' not in r.stdout


def test_integrity_failure_exits_1(small_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    assert _cli("pack", str(small_tree), str(out), "--workers", "1", "--size", "16").returncode == 0
    with h5py.File(out, "r+") as h5:
        h5["labels"][0] = 7
    r = _cli("verify", str(out))
    assert r.returncode == 1
    assert "label 7 out of range" in r.stderr
    assert "Traceback" not in r.stderr


def test_too_many_bad_images_exit_1_listing_them(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=2, size=(20, 20))
    (src / "a" / "zero.jpg").write_bytes(b"")
    out = tmp_path / "o.h5"
    r = _cli(
        "pack", str(src), str(out), "--workers", "1", "--size", "16", "--max-bad-fraction", "0"
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "max_bad_fraction=0 allows" in _error_line(r)
    assert "a/zero.jpg: zero-byte file" in r.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- verify + sidecar


@pytest.fixture
def published(small_tree: Path, packed: Path, tmp_path: Path) -> Path:
    """``packed`` published with its sidecar (counts, format version) in a fresh folder."""
    dest = tmp_path / "pub" / "asset.h5"
    info = summarize(Location(str(packed)))
    publish(
        packed,
        str(dest),
        extra={"counts": info["counts"], "num_samples": 8, "num_classes": 2, "format_version": 1},
    )
    return dest


def test_verify_checks_the_sidecar_sidecar(published: Path) -> None:
    r = _cli("verify", str(published))
    assert r.returncode == 0, r.stderr
    assert f"matches its sidecar {sidecar_url(str(published))}" in r.stdout
    assert json.loads(_cli("verify", str(published), "--json").stdout)["sidecar"] == sidecar_url(
        str(published)
    )


def test_verify_refuses_a_resealed_file_its_sidecar_contradicts(
    small_tree: Path, published: Path, tmp_path: Path
) -> None:
    # A different, consistently sealed file put where the published one was: it verifies on
    # its own, but its sidecar records another sha256, size and counts.
    other = tmp_path / "other.h5"
    pack(small_tree, other, workers=1, max_bad_fraction=0.5, config=PackConfig(compression="gzip"))
    shutil.copyfile(other, published)
    assert _cli("verify", str(published), "--no-sidecar").returncode == 0
    r = _cli("verify", str(published))
    assert r.returncode == 1
    line = _error_line(r)
    assert "does not match its sidecar" in line
    sidecar = json.loads(Path(sidecar_url(str(published))).read_text())
    assert f"sha256: sidecar says {sidecar['sha256']!r}" in r.stderr
    assert (
        f"bytes: sidecar says {sidecar['bytes']!r}, the file has {other.stat().st_size}" in r.stderr
    )


def test_verify_names_a_counts_disagreement(published: Path) -> None:
    path = Path(sidecar_url(str(published)))
    sidecar = json.loads(path.read_text())
    sidecar["counts"] = {"": {"x": 5, "y": 3}}
    path.write_text(json.dumps(sidecar))
    r = _cli("verify", str(published))
    assert r.returncode == 1
    assert (
        "counts: sidecar says {'': {'x': 5, 'y': 3}}, the file has {'': {'x': 4, 'y': 4}}"
        in r.stderr
    )


def test_verify_with_an_explicit_sidecar(published: Path, packed: Path, tmp_path: Path) -> None:
    # --sidecar names one elsewhere (here: the published one, for the unpublished copy).
    r = _cli("verify", str(packed), "--sidecar", sidecar_url(str(published)))
    assert r.returncode == 0, r.stderr
    assert "matches its sidecar" in r.stdout
    missing = _cli("verify", str(packed), "--sidecar", str(tmp_path / "none.manifest.json"))
    assert missing.returncode == 2
    assert "no sidecar at" in _error_line(missing)
    both = _cli("verify", str(packed), "--sidecar", "x", "--no-sidecar")
    assert both.returncode == 2


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [("--manifest", "--sidecar", ["x.json"]), ("--no-manifest", "--no-sidecar", [])],
)
def test_verify_refuses_the_old_sidecar_flags_naming_the_new_ones(
    published: Path, old: str, new: str, value: list[str]
) -> None:
    # A script written for an older h5forge fails clearly, not with "no such option".
    r = _cli("verify", str(published), old, *value)
    assert r.returncode == 2
    assert new in _error_line(r)
    assert _error_line(r).endswith(
        f"{old} was renamed {new} (same meaning, same values); give {new} instead"
    )


def test_verify_fails_on_a_sidecar_that_is_not_one(published: Path) -> None:
    Path(sidecar_url(str(published))).write_text("{not json")
    r = _cli("verify", str(published))
    assert r.returncode == 1
    assert "is not valid JSON" in _error_line(r)


def test_verify_without_a_sidecar_says_so(packed: Path) -> None:
    r = _cli("verify", str(packed))
    assert r.returncode == 0, r.stderr
    assert "no sidecar checked (none beside it)" in r.stdout


# --------------------------------------------------------------------------- usage: exit 2


@pytest.mark.parametrize(
    "args",
    [
        ["pack", "/nonexistent/dir", "x.h5"],
        ["pack", ".", "x.h5", "--size", "abc"],
        ["verify"],
        ["pack", ".", "x.h5", "--compression", "brotli"],
    ],
)
def test_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    r = _cli(*[a.replace("x.h5", str(tmp_path / "x.h5")) for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr


def test_existing_output_names_the_flag(small_tree: Path, packed: Path) -> None:
    before = packed.stat().st_mtime_ns
    r = _cli("pack", str(small_tree), str(packed))
    assert r.returncode == 2
    assert _error_line(r) == f"error: {packed} already exists; pass --overwrite to replace it"
    assert packed.stat().st_mtime_ns == before


def test_output_inside_the_source_is_refused(small_tree: Path) -> None:
    out = small_tree / "x" / "inside.h5"
    r = _cli("pack", str(small_tree), str(out))
    assert r.returncode == 2
    assert "is inside the source folder" in _error_line(r)
    assert not out.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "{missing}"],
        ["inspect", "{missing}"],
    ],
)
def test_a_missing_file_exits_2_without_errno_text(command: list[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.h5")
    r = _cli(*[a.replace("{missing}", missing) for a in command])
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = _error_line(r)
    assert "nope.h5" in line
    assert "[Errno" not in r.stderr


def test_inspect_of_a_corrupt_file_exits_1(packed: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_bytes(packed.read_bytes()[:4096])
    r = _cli("inspect", str(bad))
    assert r.returncode == 1, (r.stdout, r.stderr)
    _error_line(r)


# --------------------------------------------------------------------------- read-only, full


def test_a_read_only_destination_is_refused_before_packing(
    small_tree: Path, tmp_path: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    r = _run(
        in_mounts(
            [*_PY, "pack", str(small_tree), str(ro / "out.h5"), "--workers", "1"], [(ro, "ro")]
        )
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert _error_line(r) == (
        f"error: cannot write the destination: {ro} is on a read-only "
        "file system; choose a writable destination"
    )
    assert "pack " not in r.stdout  # refused before the first image
    assert list(ro.iterdir()) == []


def test_a_full_destination_is_refused_before_packing(small_tree: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    r = _run(
        in_mounts(
            [*_PY, "pack", str(small_tree), str(full / "out.h5"), "--workers", "1"],
            [(full, "tmpfs:16384")],
        )
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert _error_line(r).startswith(
        f"error: cannot write the destination: no space left on the device of {full} (disk full)"
    )
    assert "pack " not in r.stdout


def test_a_disk_that_fills_up_mid_pack_exits_1_naming_it(small_tree: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    # Room for the probe (64 KiB), not for 8 samples of 224 x 224 x 3 bytes.
    r = _run(
        in_mounts(
            [*_PY, "pack", str(small_tree), str(full / "out.h5"), "--workers", "1"],
            [(full, "tmpfs:262144")],
        )
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    line = _error_line(r)
    assert "no space left on the device of" in line
    assert "out.h5" in line
    assert "[Errno" not in r.stderr


# --------------------------------------------------------------------------- untrusted names


def test_names_with_terminal_escapes_are_printed_escaped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    evil = "cat\x1b[2J\x1b]52;c;aGk=\x07\u202e"
    write_image_folder(src, classes=(evil, "dog"), per_class=2, size=(20, 20))
    (src / evil / "broken.jpg").write_bytes(b"")
    out = tmp_path / "o.h5"
    r = _cli(
        "pack", str(src), str(out), "--workers", "1", "--size", "16", "--max-bad-fraction", "0.5"
    )
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr
    assert "quarantined cat\\x1b[2J" in r.stdout
    for args in (["inspect", str(out)], ["inspect", str(out), "--json"]):
        shown = _cli(*args)
        assert shown.returncode == 0, shown.stderr
        for control in ("\x1b", "\u202e", "\x07"):
            assert control not in shown.stdout
    assert "cat\\x1b[2J\\x1b]52;c;aGk=\\x07\\u202e 2" in _cli("inspect", str(out)).stdout
    missing = _cli("verify", str(tmp_path / "x\x1b[31mred.h5"))
    assert missing.returncode == 2
    assert "\x1b" not in missing.stderr
    assert "x\\x1b[31mred.h5" in missing.stderr
