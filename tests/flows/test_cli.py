"""``h5forge build`` and ``h5forge demo`` run as subprocesses, the way a person runs them.

The subprocesses report to the session's Prefect test server (``PREFECT_API_URL`` is set by the
``prefect_harness`` fixture): measured here, that saves the ~11-15 s each command would spend
starting its own temporary server, and the commands behave the same otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from h5forge.demo import write_bad_files, write_image_folder
from h5forge.location import Location
from h5forge.publish.sidecar import sidecar_url
from h5forge.publish.versions import read_pointer
from h5forge.verify.checks import verify
from tests.fixtures.mounts import in_mounts

pytestmark = pytest.mark.slow

_SCRIPT = Path(sys.executable).with_name("h5forge")


def h5forge(
    *args: str,
    cwd: Path,
    cache: Path,
    timeout: float = 240,
    mounts: list[tuple[Path, str]] | None = None,
    python: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the ``h5forge`` console script (the pyproject entry point), optionally with a
    read-only or tiny file system mounted for it (see tests/fixtures/mounts.py)."""
    command = _command()
    if python is not None:
        command = [sys.executable, *python, "-m", "h5forge.deployments.cli"]
    command = [*command, *args]
    if mounts:
        command = in_mounts(command, mounts)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _command() -> list[str]:
    return [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "h5forge.deployments.cli"]


def _error_line(run: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in run.stderr + run.stdout, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors, run.stderr[-3000:]
    return errors[0]


@pytest.fixture
def small_folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, classes=("cat", "dog"), per_class=6, size=((40, 60), (40, 60)))
    return root


def test_demo_builds_publishes_and_prints_the_summary(prefect_harness: str, tmp_path: Path) -> None:
    run = h5forge("demo", cwd=tmp_path, cache=tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    dest = tmp_path / "h5forge-demo" / "demo.h5"
    for line in (
        f"asset:       {dest}",
        "samples:     300 in 4 classes, 2 quarantined",
        "sha256:",
        f"sidecar:     {dest}.manifest.json",
        f"preview:     {dest}.preview.png",
        "smoke-load:  fork ",
    ):
        assert line in run.stdout
    assert Path(f"{dest}.manifest.json").is_file()
    assert Path(f"{dest}.preview.png").is_file()
    assert verify(str(dest)).sha256 in run.stdout
    check = h5forge("verify", str(dest), cwd=tmp_path, cache=tmp_path / "cache")
    assert check.returncode == 0, check.stderr


def test_build_runs_the_flow_on_a_folder(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "out" / "small.h5"
    run = h5forge(
        "build",
        str(small_folder),
        str(dest),
        "--size",
        "32",
        "--smoke-workers",
        "0",
        cwd=tmp_path,
        cache=tmp_path / "cache",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "samples:     12 in 2 classes, 0 quarantined" in run.stdout
    assert verify(str(dest)).num_samples == 12


def test_a_versioned_build_is_read_back_by_the_name_it_was_built_to(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    # Names round-trip: built with --versioned to DEST.h5 (no file of that name is written),
    # verified and inspected as DEST.h5, as its base, and by --version.
    dest = tmp_path / "out" / "small.h5"
    args = ("--versioned", "--size", "32", "--smoke-workers", "0")
    run = h5forge("build", str(small_folder), str(dest), *args, cwd=tmp_path, cache=tmp_path / "c")
    assert run.returncode == 0, run.stderr[-3000:]
    pointer = read_pointer(Location(str(dest)))
    assert pointer is not None
    assert pointer.kind == "sharded"  # the default of a versioned build
    assert "shards:      1 (1 new, 0 reused from the previous version)" in run.stdout
    assert f"manifest:    {pointer.url}" in run.stdout
    assert not dest.exists()
    base = str(dest)[: -len(".h5")]
    for name, version in [(str(dest), []), (base, []), (base, ["--version", pointer.sha256[:16]])]:
        for command in ("verify", "inspect"):
            got = h5forge(command, name, *version, "--json", cwd=tmp_path, cache=tmp_path / "c")
            assert got.returncode == 0, (command, name, got.stderr[-3000:])
            assert json.loads(got.stdout)["version"] == pointer.sha256, (command, name)


def test_build_failure_exits_1_with_one_paragraph_and_no_traceback(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    write_bad_files(small_folder / "cat")
    dest = tmp_path / "out" / "small.h5"
    run = h5forge(
        "build",
        str(small_folder),
        str(dest),
        "--max-bad-fraction",
        "0",
        "--smoke-workers",
        "0",
        cwd=tmp_path,
        cache=tmp_path / "cache",
    )
    assert run.returncode == 1
    assert "error: build failed, nothing was published:" in run.stderr
    assert "max_bad_fraction" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert not dest.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["build", "images", "out.h5", "--size", "-1"],
            "error: invalid value for --size: size '-1' is not S, HxW or none",
        ),
        (
            ["build", "images", "out.h5", "--size", "4"],
            "error: invalid value for --size: size 4 is out of range",
        ),
        (
            ["build", "images", "out.h5", "--compression", "zstd", "--compression-level", "0"],
            "compression_level=0 is out of range for zstd (1..22)",
        ),
        (["build", "/nonexistent", "out.h5"], "source /nonexistent does not exist"),
        (["build", "images", "out.hdf5"], "must end in .h5"),
        (["build", "images", "out.h5", "--sha256", "xyz"], "64 hexadecimal digits"),
        (
            ["build", "images", "out.h5", "--layout", "blob"],
            "invalid value for --layout: layout='blob' is not one of 'decoded', 'encoded'",
        ),
        (["build", "images"], "Missing argument"),
        (
            ["build", "images", "out.h5", "--versioned", "--keep-versions", "0"],
            "keep_versions=0 must be an integer >= 1",
        ),
        (
            ["build", "images", "out.h5", "--versioned", "--min-age-s", "-1"],
            "min_age_s=-1.0 must be a finite number of seconds >= 0",
        ),
        (
            ["build", "images", "out.h5", "--max-shard-size", "64MiB"],
            "--max-shard-size 64MiB shards a version, and the build is not versioned",
        ),
        (
            ["build", "images", "out.h5", "--versioned", "--max-shard-size", "1KiB"],
            "max_shard_size='1KiB' must be at least 1MiB",
        ),
        (
            [
                *("build", "images", "out.h5", "--versioned", "--executor", "dask"),
                *("--dask-address", "tcp://127.0.0.1:1", "--staging", "parts"),
            ],
            "leave staging empty, or set max_shard_size='off' (CLI: --max-shard-size off)",
        ),
        (["demo", "out.hdf5"], "must end in .h5"),
    ],
)
def test_usage_errors_exit_2_before_any_work(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from h5forge.deployments.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


# --------------------------------------------------------------------------- before Prefect


def _imported(run: subprocess.CompletedProcess[str]) -> list[str]:
    """The modules a ``python -X importtime`` run imported."""
    return [
        ln.rsplit("|", 1)[-1].strip()
        for ln in run.stderr.splitlines()
        if ln.startswith("import time:")
    ]


@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (["/nonexistent", "out.h5", "--size", "0"], "error: invalid value for --size: size 0 "),
        (["/nonexistent", "out.h5"], "error: source /nonexistent does not exist"),
        (["nope://bucket/x", "out.h5"], "error: source 'nope://bucket/x' uses protocol 'nope', "),
        # A protocol fsspec knows, a host that cannot exist (.invalid, RFC 6761): found by the
        # checks, not by a fetch retried three times after Prefect started (18.8 s before).
        (["ftp://host.invalid/x", "out.h5"], "error: source ftp://host.invalid/x: host "),
        (["{images}", "{dest}"], "error: {dest} already exists; pass --overwrite to replace it"),
        (
            ["{images}", "{images}/cat/../out.h5"],
            "error: destination {images}/cat/../out.h5 is inside the source folder {images}: ",
        ),
    ],
    ids=["size-0", "missing-source", "unknown-protocol", "unknown-host", "dest-exists", "inside"],
)
def test_pack_and_build_refuse_a_mistake_alike_before_prefect(
    mistake: list[str], expected: str, small_folder: Path, tmp_path: Path
) -> None:
    # One check, run by both commands before anything slow: the same error line, exit 2,
    # and Prefect never imported (that is what made every rejected `build` cost ~18 s).
    dest = tmp_path / "exists.h5"
    dest.write_bytes(b"not replaced")
    args = [a.format(images=small_folder, dest=dest) for a in mistake]
    lines = {}
    for command in ("pack", "build"):
        run = h5forge(
            command, *args, cwd=tmp_path, cache=tmp_path / "cache", python=["-X", "importtime"]
        )
        assert run.returncode == 2, (command, run.stderr[-3000:])
        lines[command] = _error_line(run)
        imported = _imported(run)
        assert "h5forge.cli.inputs" in imported, command  # the shared checks ran
        assert not [m for m in imported if m.split(".")[0] == "prefect"], "prefect imported"
    assert lines["pack"] == lines["build"]
    assert lines["build"].startswith(expected.format(dest=dest, images=small_folder)), lines
    assert dest.read_bytes() == b"not replaced"
    assert not (small_folder / "out.h5").exists()


@pytest.mark.parametrize("named", ["--cache-dir", "XDG_CACHE_HOME"])
def test_build_refuses_a_cache_inside_the_source_before_prefect(
    named: str, small_folder: Path, tmp_path: Path
) -> None:
    # The fetch cache (downloads, extractions, the default Dask staging) inside the source
    # folder would become part of what the next build reads.
    before = sorted(p.name for p in small_folder.iterdir())
    flag = ["--cache-dir", str(small_folder / "c")] if named == "--cache-dir" else []
    cache = small_folder if named == "XDG_CACHE_HOME" else tmp_path / "cache"
    run = h5forge(
        "build",
        str(small_folder),
        str(tmp_path / "out.h5"),
        *flag,
        cwd=tmp_path,
        cache=cache,
        python=["-X", "importtime"],
    )
    assert run.returncode == 2, run.stderr[-3000:]
    line = _error_line(run)
    assert line.startswith("error: cache folder "), line
    assert f"is inside the source folder {small_folder}: " in line
    assert line.endswith("pass a cache_dir (--cache-dir) outside it")
    assert not [m for m in _imported(run) if m.split(".")[0] == "prefect"], "prefect imported"
    assert sorted(p.name for p in small_folder.iterdir()) == before
    assert not (tmp_path / "out.h5").exists()


def test_a_usage_error_is_found_without_importing_prefect(tmp_path: Path) -> None:
    # Validating a BuildConfig and the paths must not start (or even import) Prefect.
    for args in (
        ["build", "/nonexistent", "out.h5", "--size", "0"],
        ["build", "/nonexistent", "out.h5"],
        ["build", "ftp://host.invalid/x", "out.h5"],
    ):
        run = h5forge(*args, cwd=tmp_path, cache=tmp_path / "cache", python=["-X", "importtime"])
        assert run.returncode == 2, run.stderr[-3000:]
        imported = _imported(run)
        assert "h5forge.flows.config" in imported or args[3:] == ["--size", "0"]
        assert not [m for m in imported if m.split(".")[0] == "prefect"], "prefect imported"


def test_an_existing_destination_names_the_flag(small_folder: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out.h5"
    dest.write_bytes(b"not replaced")
    run = h5forge("build", str(small_folder), str(dest), cwd=tmp_path, cache=tmp_path / "c")
    assert run.returncode == 2
    assert _error_line(run) == f"error: {dest} already exists; pass --overwrite to replace it"
    assert dest.read_bytes() == b"not replaced"


@pytest.mark.parametrize("command", ["build", "demo"])
def test_a_read_only_destination_exits_2_before_any_work(
    command: str, small_folder: Path, tmp_path: Path
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    args = [str(small_folder), str(ro / "x.h5")] if command == "build" else [str(ro / "x.h5")]
    run = h5forge(command, *args, cwd=tmp_path, cache=tmp_path / "cache", mounts=[(ro, "ro")])
    assert run.returncode == 2, run.stderr[-3000:]
    assert _error_line(run) == (
        f"error: cannot write the destination: {ro} is on a read-only "
        "file system; choose a writable destination"
    )
    assert "Prefect" not in run.stderr  # refused before Prefect was started
    assert list(ro.iterdir()) == []


def test_demo_run_failure_exits_1(prefect_harness: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache-is-a-file"
    cache.write_text("")
    run = h5forge(
        "demo",
        str(tmp_path / "d" / "demo.h5"),
        "--cache-dir",
        str(cache),
        cwd=tmp_path,
        cache=tmp_path / "xdg",
    )
    assert run.returncode == 1, run.stderr[-3000:]
    line = _error_line(run)
    assert line.startswith("error: build failed, nothing was published: ")
    assert str(cache) in line
    assert "[Errno" not in line  # (Prefect's own log lines above it are Prefect's)


# --------------------------------------------------------------------------- build options


def test_build_takes_every_pack_option(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    # The options `build` could not set before: --sidecar, --quality, --shorter-side,
    # --fletcher32, and an HxW size.
    rows = [
        f"{p.relative_to(small_folder).as_posix()},{p.parent.name}"
        for p in sorted(small_folder.rglob("*.*"))[::2]
    ]
    (small_folder / "labels.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    dest = tmp_path / "out" / "opts.h5"
    run = h5forge(
        "build",
        str(small_folder),
        str(dest),
        "--listing",
        "labels.csv",
        "--size",
        "32x48",
        "--shorter-side",
        "60",
        "--quality",
        "55",
        "--fletcher32",
        "--smoke-workers",
        "0",
        cwd=tmp_path,
        cache=tmp_path / "cache",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"samples:     {len(rows)} in 2 classes" in run.stdout
    with h5py.File(dest) as h5:
        config = json.loads(h5.attrs["config_json"])
        assert h5["images"].fletcher32
        assert h5["images"].shape[1:] == (32, 48, 3)
    assert config["fletcher32"] is True
    assert (config["image"]["quality"], config["image"]["shorter_side"]) == (55, 60)
    assert verify(str(dest)).num_samples == len(rows)


# --------------------------------------------------------------------------- partial publish


def test_a_full_disk_at_the_preview_says_the_asset_was_published(
    prefect_harness: str, small_folder: Path, tmp_path: Path
) -> None:
    args = ("--size", "64", "--smoke-workers", "0", "--workers", "1")
    # A first build, to a roomy folder, measures what the publish writes.
    roomy = tmp_path / "roomy" / "a.h5"
    first = h5forge(
        "build", str(small_folder), str(roomy), *args, cwd=tmp_path, cache=tmp_path / "cache"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    page = 4096

    def pages(path: Path | str) -> int:
        return -(-Path(path).stat().st_size // page) * page

    preview = Path(f"{roomy}.preview.png")
    assert preview.stat().st_size > 2 * page, "the preview must not fit in the slack"
    # Room for the asset and its sidecar (and the 64 KiB probe before them), not the preview.
    room = pages(roomy) + pages(sidecar_url(str(roomy))) + page
    full = tmp_path / "full"
    full.mkdir()
    dest = full / "a.h5"
    # The mount lives as long as the namespace: look at what was published from inside it.
    script = (
        '"$@"; echo "build-exit=$?"; ls -a "$DEST_DIR"; '
        '"$PY" -m h5forge.cli verify "$DEST_DIR/a.h5"; echo "verify-exit=$?"'
    )
    command = [*_command(), "build", str(small_folder), str(dest), *args]
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "DEST_DIR": str(full),
        "PY": sys.executable,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    run = subprocess.run(
        in_mounts(["sh", "-c", script, "sh", *command], [(full, f"tmpfs:{room}")]),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert "build-exit=1" in run.stdout, run.stderr[-3000:]
    line = _error_line(run)
    assert "nothing was published" not in run.stderr
    assert line.startswith(
        f"error: build failed after publishing: {dest} and its sidecar "
        f"were published; only the preview {dest}.preview.png could not "
        "be written: no space left on the device"
    )
    listed = run.stdout.split("build-exit=1", 1)[1].split()
    assert {"a.h5", "a.h5.manifest.json"} <= set(listed)
    assert "a.h5.preview.png" not in listed  # no torn PNG left behind
    assert "verify-exit=0" in run.stdout  # the published asset is whole, and matches its sidecar
    assert "matches its sidecar" in run.stdout
