"""safe_extract: hostile archives are refused whole, good archives of every format extract."""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from h5forge.errors import UnsafeArchiveError
from h5forge.fetch.extract import MAX_DEPTH, MAX_LINKS, detect_archive, safe_extract
from h5forge.fetch.staging import discard, exclusive
from h5forge.files import mark, remove_tree
from h5forge.paths import resolve
from h5forge.text import printable
from tests.fixtures.archives import (
    ATTACKS,
    GOOD_FILES,
    GOOD_FORMATS,
    Attack,
    tar_bytes,
    write_good_archive,
)
from tests.fixtures.trees import deep_chain, touch_at


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_rejected_naming_member_and_nothing_written(tmp_path: Path, attack: Attack) -> None:
    work = tmp_path / "work"
    out = work / "out"
    out.mkdir(parents=True)
    archive = tmp_path / f"attack{attack.suffix}"
    attack.build(archive)
    before = _tree(tmp_path)

    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract(archive, out / "dest", **attack.caps)

    assert repr(attack.member) in str(info.value)
    assert _tree(tmp_path) == before  # no staging left, nothing escaped
    assert not Path("/tmp/h5forge-evil.txt").exists()


@pytest.mark.parametrize("suffix", list(GOOD_FORMATS))
def test_good_archive_extracts(tmp_path: Path, suffix: str) -> None:
    # A misleading name: the format must be detected from the content.
    archive = tmp_path / "download.bin"
    write_good_archive(archive, suffix)
    dest = tmp_path / "out" / "dest"

    assert safe_extract(archive, dest) == str(dest)

    for name, data in GOOD_FILES.items():
        assert (dest / name).read_bytes() == data
    latest = dest / "data" / "latest"
    assert latest.is_symlink()
    assert os.readlink(latest) == "cat"
    assert (latest / "a.jpg").read_bytes() == GOOD_FILES["data/cat/a.jpg"]
    if suffix != ".zip":
        copy = dest / "data" / "dog" / "copy.jpg"
        assert not copy.is_symlink()
        assert copy.read_bytes() == GOOD_FILES["data/cat/a.jpg"]
    assert os.listdir(tmp_path / "out") == ["dest"]


def test_later_member_replaces_symlink_without_writing_through_it(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        target = tarfile.TarInfo("target.txt")
        target.size = 8
        tf.addfile(target, io.BytesIO(b"original"))
        link = tarfile.TarInfo("f")
        link.type = tarfile.SYMTYPE
        link.linkname = "target.txt"
        tf.addfile(link)
        replacement = tarfile.TarInfo("f")
        replacement.size = 11
        tf.addfile(replacement, io.BytesIO(b"replacement"))

    dest = Path(safe_extract(archive, tmp_path / "dest"))

    assert (dest / "target.txt").read_bytes() == b"original"
    assert not (dest / "f").is_symlink()
    assert (dest / "f").read_bytes() == b"replacement"


def test_not_an_archive_and_bad_caps(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"<html>not found</html>")
    assert detect_archive(junk) is None
    with pytest.raises(ValueError, match="not a supported archive"):
        safe_extract(junk, tmp_path / "dest")
    good = tmp_path / "good.tar"
    good.write_bytes(tar_bytes({"x/y": b"1"}))
    with pytest.raises(ValueError, match="max_members=0"):
        safe_extract(good, tmp_path / "dest", max_members=0)
    assert _tree(tmp_path) == ["good.tar", "junk.tar.gz"]


def test_truncated_archive_names_member(tmp_path: Path) -> None:
    data = tar_bytes({"big.bin": os.urandom(200_000)}, "w:gz")
    archive = tmp_path / "cut.tgz"
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnsafeArchiveError, match="'big.bin'.*corrupt or truncated"):
        safe_extract(archive, tmp_path / "out" / "dest")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_existing_destination(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"new.txt": b"new"}))
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.txt").write_text("old")

    with pytest.raises(FileExistsError, match="replace=True"):
        safe_extract(archive, dest)
    assert _tree(dest) == ["old.txt"]

    safe_extract(archive, dest, replace=True)
    assert _tree(dest) == ["new.txt"]
    assert sorted(os.listdir(tmp_path)) == ["a.tar", "dest"]

    (tmp_path / "empty").mkdir()
    safe_extract(archive, tmp_path / "empty")  # an empty folder counts as free
    assert _tree(tmp_path / "empty") == ["new.txt"]


def test_member_clashing_with_an_earlier_one(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tf:
        for name in ("a", "a/b"):  # a file, then a member that needs "a" to be a folder
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UnsafeArchiveError, match="'a/b' clashes with an earlier member"):
        safe_extract(archive, tmp_path / "dest")
    assert os.listdir(tmp_path) == ["a.tar"]


# --------------------------------------------------------------------------- depth and links


def _raw_tar(path: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_200])
def test_member_deeper_than_the_limit_is_refused_before_anything_is_written(
    tmp_path: Path, depth: int
) -> None:
    archive = tmp_path / "deep.tar"
    name = "/".join(["d"] * (depth - 1)) + "/f.txt"
    _raw_tar(archive, [_member("ok.txt"), _member(name)])

    with pytest.raises(
        UnsafeArchiveError, match=f"nested {depth} levels deep, over the limit of {MAX_DEPTH}"
    ) as info:
        safe_extract(archive, tmp_path / "out" / "dest")

    assert "RecursionError" not in repr(info.value.__context__)
    assert os.listdir(tmp_path / "out") == []


def test_member_at_the_depth_limit_extracts(tmp_path: Path) -> None:
    archive = tmp_path / "deep.tar"
    name = "/".join(["d"] * (MAX_DEPTH - 1)) + "/f.txt"
    _raw_tar(archive, [_member(name)])
    dest = Path(safe_extract(archive, tmp_path / "dest"))
    assert dest.joinpath(*name.split("/")).read_bytes() == b"x"


def test_depth_reached_through_in_archive_links_is_refused(tmp_path: Path) -> None:
    # Each name is shallow, but "l" points at the deep folder: "l/..." lands twice as deep.
    half = "/".join(["d"] * 40)
    archive = tmp_path / "links.tar"
    _raw_tar(
        archive,
        [
            _member(half, tarfile.DIRTYPE),
            _member("l", tarfile.SYMTYPE, half),
            _member("l/" + "/".join(["e"] * 40) + "/f.txt"),
        ],
    )
    with pytest.raises(UnsafeArchiveError, match=r"member 'l/e/.*lands 81 levels deep"):
        safe_extract(archive, tmp_path / "out" / "dest")
    assert os.listdir(tmp_path / "out") == []


def test_symlink_chain_longer_than_the_kernel_allows_is_refused(tmp_path: Path) -> None:
    # os.path.realpath recurses once per link before Python 3.13: 1,500 links overflowed it.
    n = 1_500
    links = [_member(f"l{i}", tarfile.SYMTYPE, f"l{i + 1}" if i < n - 1 else ".") for i in range(n)]
    archive = tmp_path / "chain.tar"
    _raw_tar(archive, [*links, _member("l0/x")])
    with pytest.raises(UnsafeArchiveError, match=f"'l0/x' passes more than {MAX_LINKS} symbolic"):
        safe_extract(archive, tmp_path / "out" / "dest")
    assert os.listdir(tmp_path / "out") == []


def test_short_link_chain_inside_the_archive_still_works(tmp_path: Path) -> None:
    archive = tmp_path / "chain.tar"
    _raw_tar(
        archive,
        [
            _member("real", tarfile.DIRTYPE),
            _member("a", tarfile.SYMTYPE, "b"),
            _member("b", tarfile.SYMTYPE, "real"),
            _member("a/x.txt"),
        ],
    )
    dest = Path(safe_extract(archive, tmp_path / "dest"))
    assert (dest / "real" / "x.txt").read_bytes() == b"x"


def _deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/.../d``, ``depth`` levels, with a file and a link to / now and then."""

    def now_and_then(level: int, fd: int) -> None:
        if level % 100 == 0:
            touch_at("f", fd)
            os.symlink("/", "up", dir_fd=fd)  # must be removed, never followed

    top.mkdir()
    deep_chain(top, depth, now_and_then)


@pytest.fixture
def deep_leftovers(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied afterwards without recursion whatever the test left: a 1,200-deep
    tree left in pytest's temp folder would break pytest's own (recursive) clean-up."""
    yield tmp_path
    for entry in os.listdir(tmp_path):
        path = tmp_path / entry
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)


@pytest.mark.slow  # ~1,200 rmdir calls: seconds on a busy ext4
def test_a_1200_deep_staging_tree_is_removed_without_recursion(deep_leftovers: Path) -> None:
    tmp_path = deep_leftovers
    staging = tmp_path / "dest.staging-0123456789ab"
    _deep_tree(staging, 1_200)
    (tmp_path / "keep.txt").write_text("outside")
    discard(staging)
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]


@pytest.mark.slow  # ~1,200 rmdir calls: seconds on a busy ext4
def test_leftover_1200_deep_staging_is_cleared_by_the_next_writer(deep_leftovers: Path) -> None:
    tmp_path = deep_leftovers
    dest = tmp_path / "dest"
    _deep_tree(tmp_path / "dest.staging-0123456789ab", 1_200)
    mark(tmp_path / "dest.staging-0123456789ab", "staging")  # as a killed run leaves it
    with exclusive(dest):
        pass
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- names shown


def test_escape_sequences_in_member_names_are_shown_escaped(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    name = "x\x1b]0;owned\x07\x1b[2J/../../evil\u202etxt.exe"
    _raw_tar(archive, [_member(name)])
    with pytest.raises(UnsafeArchiveError) as info:
        safe_extract(archive, tmp_path / "dest")
    text = str(info.value)
    assert f"'{printable(name)}'" in text
    assert "\\x1b]0;owned\\x07\\x1b[2J" in text
    assert text.isprintable()


# --------------------------------------------------------------------------- storage failures


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs, mounted for the test and unmounted after it."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: cannot make a tiny filesystem")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _big_tar(path: Path) -> None:
    # Incompressible, so the 1 MiB tmpfs fills on the second of three 600 kB files.
    path.write_bytes(tar_bytes({f"data/f{i}.bin": os.urandom(600_000) for i in range(3)}))


def _one_line_storage_error(exc: BaseException, what: str) -> str:
    assert not isinstance(exc, UnsafeArchiveError)
    text = str(exc)
    assert text.startswith(what), text
    assert "\n" not in text
    assert "[Errno" not in text
    assert "No space left on device" not in text
    assert exc.__cause__ is None
    assert exc.__suppress_context__  # printed alone: no "During handling..." chain
    return text


def test_disk_full_is_an_oserror_naming_the_file_and_nothing_is_left(
    tmp_path: Path, tiny_fs: Path
) -> None:
    archive = tmp_path / "big.tar"
    _big_tar(archive)
    dest = tiny_fs / "dest"

    with pytest.raises(OSError) as info:  # noqa: PT011 - the type is the point; message below
        safe_extract(archive, dest)

    assert info.value.errno == errno.ENOSPC
    text = _one_line_storage_error(info.value, "disk full at ")
    assert f"'{dest}/data/f" in text  # the file, named under dest, not the staging folder
    assert "choose a destination on another disk" in text
    assert os.listdir(tiny_fs) == []  # staging removed, no half-extracted dest
    assert shutil.disk_usage(tiny_fs).used < 64 * 1024  # the space is given back


def test_read_only_destination_is_named_as_such(tmp_path: Path, tiny_fs: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"x.txt": b"1"}))
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)

    with pytest.raises(OSError) as info:  # noqa: PT011 - the type is the point; message below
        safe_extract(archive, tiny_fs / "dest")

    assert info.value.errno == errno.EROFS
    text = _one_line_storage_error(info.value, "read-only file system at ")
    assert f"'{tiny_fs}'" in text
    assert "writable destination" in text
    assert os.listdir(tiny_fs) == []


def test_permission_denied_is_named_as_such(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"x.txt": b"1"}))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    script = (
        "from h5forge.fetch.extract import safe_extract\n"
        "try:\n"
        f"    safe_extract({str(archive)!r}, {str(locked / 'dest')!r})\n"
        "except PermissionError as e:\n"
        "    print(repr(e.errno), e.__suppress_context__, e, sep='|')\n"
    )
    command = [sys.executable, "-c", script]
    if os.geteuid() == 0:
        # Root ignores folder permissions; without the two DAC capabilities it does not.
        if shutil.which("setpriv") is None:
            pytest.skip(
                "running as root and setpriv(1) is missing: cannot drop "
                "CAP_DAC_OVERRIDE to provoke a real EACCES"
            )
        drop = "-dac_override,-dac_read_search"
        command = ["setpriv", "--bounding-set", drop, "--inh-caps", drop, *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    got_errno, suppressed, text = proc.stdout.strip().split("|")
    assert int(got_errno) == errno.EACCES
    assert suppressed == "True"
    assert text.startswith(f"permission denied at '{locked}' while extracting"), text
    assert "[Errno" not in text
    assert os.listdir(locked) == []


def test_resolve_agrees_with_realpath(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "sub" / "f.txt").write_text("x")
    os.symlink("real", tmp_path / "a")
    os.symlink("a/sub", tmp_path / "b")
    os.symlink("../..", tmp_path / "real" / "sub" / "up")
    os.symlink(tmp_path / "real", tmp_path / "abs")
    os.symlink("nowhere/else", tmp_path / "dangling")
    os.symlink("self", tmp_path / "self")
    cases = [
        "a",
        "b/f.txt",
        "b/../sub/f.txt",
        "b/up/a/sub",
        "abs/sub/up/b",
        "dangling/x/..",
        "missing/../a",
        ".",
        "a/./sub//f.txt",
        "b/f.txt/..",
    ]
    for rel in cases:
        assert resolve(tmp_path / rel) == os.path.realpath(tmp_path / rel), rel
        assert resolve(rel, base=str(tmp_path)) == os.path.realpath(tmp_path / rel), rel
    with pytest.raises(ValueError, match="more than 3 symbolic links"):
        resolve(tmp_path / "b" / "up" / "b", max_links=3)
    with pytest.raises(ValueError, match="more than 40 symbolic links"):
        resolve(tmp_path / "self")  # os.path.realpath returns a loop as it is
