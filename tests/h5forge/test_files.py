"""Files h5forge creates: exclusive, never through a planted link, locked per output, marked.

Every attack is provoked for real: a symlink (or a hard link, a FIFO, a foreign file) is planted
at the very name h5forge is about to use, pointing at a victim file whose bytes are compared
afterwards; concurrent runs are real processes; a dead run is one killed with SIGKILL.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h5forge import files
from h5forge.demo import write_image_folder
from h5forge.errors import BusyError, UnsafePathError
from h5forge.fetch.staging import commit, exclusive, new_staging
from h5forge.location import Location
from h5forge.locks import folder_lock, lock_file
from h5forge.output_lock import output_lock
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.preview import write_preview
from h5forge.publish.storage import remove_stale_temps
from h5forge.scale.merge import merge_parts
from h5forge.verify.checks import verify

SMALL = ImageConfig(resize="resize", size=(16, 16))
ENCODED = ImageConfig(layout="encoded", encoding="original", resize="none", size=None)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(b"precious bytes that must never change")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    write_image_folder(root, classes=("a", "b"), per_class=3, seed=3, size=(20, 24))
    return root


def _plant(kind: str, at: Path, victim: Path) -> None:
    if kind == "symlink":
        at.symlink_to(victim)
    elif kind == "dangling symlink":
        at.symlink_to(victim.with_name("not-there"))
    else:
        os.link(victim, at)


# --- the primitive ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link"])
def test_create_exclusive_refuses_any_existing_name(
    tmp_path: Path, victim: Path, kind: str
) -> None:
    at = tmp_path / "new.bin"
    _plant(kind, at, victim)
    with pytest.raises(UnsafePathError, match=f"cannot create {at}: a .*already has that name"):
        files.create_exclusive(at)
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert not victim.with_name("not-there").exists()  # a dangling link was not followed


def test_replace_file_replaces_a_planted_link_instead_of_writing_through(
    tmp_path: Path, victim: Path
) -> None:
    at = tmp_path / "out.png"
    at.symlink_to(victim)
    files.replace_file(at, b"new")
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert not at.is_symlink()
    assert at.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png", "victim.txt"]


def test_marked_folders_only_are_removed_and_never_through_links(
    tmp_path: Path, victim: Path
) -> None:
    mine = files.make_marked_dir(tmp_path / "work-1", "test")
    (mine / "link").symlink_to(victim)
    (mine / "sub").mkdir()
    (mine / "sub" / "outside").symlink_to(tmp_path)
    users = tmp_path / "work-2"  # the user's own look-alike, no marker
    users.mkdir()
    (users / "data").write_bytes(b"x")
    faked = tmp_path / "work-3"  # a marker that is a symlink to a real marker is not one
    faked.mkdir()
    (faked / files.MARKER_NAME).symlink_to(mine / files.MARKER_NAME)
    linked = tmp_path / "work-4"  # a symlink to a marked folder is not a marked folder
    linked.symlink_to(mine)
    assert files.is_ours(mine, "test")
    assert not files.is_ours(mine, "other")
    assert not files.is_ours(users)
    assert not files.is_ours(faked)
    assert not files.is_ours(linked)
    assert not files.remove_marked(users)
    assert (users / "data").exists()
    assert not files.remove_marked(faked)
    assert faked.is_dir()
    assert not files.remove_marked(linked)
    assert mine.is_dir()
    assert files.remove_marked(mine, "test")
    assert not mine.exists()
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert tmp_path.is_dir()
    assert users.is_dir()


# --- pack: the partial, its spool and the lock ------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "image"),
    [(".partial", SMALL), (".partial", ENCODED), (".partial.blob", ENCODED)],
    ids=["partial", "partial-encoded", "spool"],
)
@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_pack_refuses_a_link_planted_at_its_temp_names(
    tiny: Path, tmp_path: Path, victim: Path, suffix: str, image: ImageConfig, kind: str
) -> None:
    out = tmp_path / "out.h5"
    planted = Path(str(out) + suffix)
    _plant(kind, planted, victim)
    with pytest.raises(UnsafePathError, match=rf"cannot create {planted}: a "):
        pack(tiny, out, config=PackConfig(image), workers=1)
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert planted.is_symlink() if kind == "symlink" else planted.stat().st_nlink == 2
    assert not out.exists()
    assert not Path(str(out) + ".lock").exists()
    other = {Path(str(out) + s) for s in (".partial", ".partial.blob")} - {planted}
    assert not any(p.exists() for p in other)  # what the run made is gone again


def test_pack_refuses_an_h5_swapped_in_after_it_created_the_partial(
    tiny: Path, tmp_path: Path
) -> None:
    """The TOCTOU case: the partial is replaced by a link to another HDF5 file mid-pack."""
    other = tmp_path / "someone-elses.h5"
    with h5py.File(other, "w") as h5:
        h5["x"] = np.arange(10)
    before = other.read_bytes()
    out = tmp_path / "out.h5"
    partial = Path(str(out) + ".partial")

    def swap(done: int, total: int) -> None:
        if done == total:  # every sample is in; the seal reopens the partial by name next
            partial.rename(tmp_path / "moved-away.h5")
            partial.symlink_to(other)

    with pytest.raises(UnsafePathError, match="no longer the file this run created"):
        pack(tiny, out, config=PackConfig(SMALL), workers=1, on_progress=swap)
    assert other.read_bytes() == before
    assert not out.exists()
    assert partial.is_symlink()  # not ours: left alone


@pytest.mark.parametrize("kind", ["symlink", "hard link", "folder", "foreign file"])
def test_pack_refuses_a_lock_file_it_did_not_make(
    tiny: Path, tmp_path: Path, victim: Path, kind: str
) -> None:
    out = tmp_path / "out.h5"
    lock = Path(str(out) + ".lock")
    if kind == "folder":
        lock.mkdir()
    elif kind == "foreign file":
        lock.write_bytes(b"my notes")
    else:
        _plant(kind, lock, victim)
    with pytest.raises(UnsafePathError, match=f"{lock} is "):
        pack(tiny, out, config=PackConfig(SMALL), workers=1)
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert not out.exists()
    if kind == "foreign file":
        assert lock.read_bytes() == b"my notes"


_HOLD = """
import os, sys, time
from h5forge.output_lock import output_lock
with output_lock(sys.argv[1]) as lock:
    os.close(lock.create(sys.argv[1] + ".partial"))
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline() == "held\n"
    return proc


def test_a_live_run_holds_the_output_and_the_other_is_told_who(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.h5"
    holder = _holder(out)
    try:
        partial_before = Path(str(out) + ".partial").stat()
        with pytest.raises(
            BusyError,
            match=rf"{out} is being written by another h5forge run "
            rf"\(pid {holder.pid} on .*kill {holder.pid}",
        ):
            pack(tiny, out, config=PackConfig(SMALL), workers=1)
        # the live run's partial is untouched
        assert files.same_file(Path(str(out) + ".partial").stat(), partial_before)
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_runs_lock_is_taken_over_and_its_partial_removed(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.h5"
    holder = _holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    record = json.loads(Path(str(out) + ".lock").read_text())
    assert record["pid"] == holder.pid
    assert record["files"][0]["name"] == "out.h5.partial"
    res = pack(tiny, out, config=PackConfig(SMALL), workers=1)
    assert res.num_samples == 6
    assert verify(str(out)).num_samples == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5"]


def test_a_leftover_partial_no_run_recorded_is_kept_and_named(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.h5"
    partial = Path(str(out) + ".partial")
    partial.write_bytes(b"not made by a recorded run")
    with pytest.raises(UnsafePathError, match="no h5forge run recorded making it"):
        pack(tiny, out, config=PackConfig(SMALL), workers=1)
    assert partial.read_bytes() == b"not made by a recorded run"


def test_two_cli_packs_to_one_output_one_wins_the_other_exits_2(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image_folder(
        src, classes=("a", "b"), per_class=150, seed=4, size=(120, 160), formats=("png",)
    )
    out = tmp_path / "out.h5"
    cmd = [
        sys.executable,
        "-m",
        "h5forge.cli",
        "pack",
        str(src),
        str(out),
        "--size",
        "64",
        "--workers",
        "1",
    ]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = Path(str(out) + ".lock")
    deadline = time.monotonic() + 60
    # Until the first run holds the lock and has written its record (pid, host) into it.
    while (
        first.poll() is None
        and time.monotonic() < deadline
        and not (lock.exists() and lock.stat().st_size > 0)
    ):
        time.sleep(0.01)
    # Hold the first run still while the second tries (a fast first run could otherwise finish
    # before the second starts); a stopped process keeps its lock, as a busy one does.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    assert second.returncode == 2, second.stderr
    assert f"{out} is being written by another h5forge run (pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    assert verify(str(out)).num_samples == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.h5", "src"]


# --- merge ------------------------------------------------------------------------------------


def test_merge_holds_the_output_and_refuses_a_planted_partial(
    packed_decoded: PackResult, tmp_path: Path, victim: Path
) -> None:
    out = tmp_path / "m.h5"
    Path(str(out) + ".partial").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="already has that name"):
        merge_parts([packed_decoded.path], out)
    assert victim.read_bytes() == b"precious bytes that must never change"
    Path(str(out) + ".partial").unlink()
    with output_lock(out), pytest.raises(BusyError, match=f"pid {os.getpid()}"):
        merge_parts([packed_decoded.path], out)
    assert merge_parts([packed_decoded.path], out).num_samples == packed_decoded.num_samples


# --- preview, publish temps, staging ----------------------------------------------------------


def test_preview_and_published_preview_replace_a_planted_link(
    packed_decoded: PackResult, tmp_path: Path, victim: Path
) -> None:
    png = tmp_path / "x.h5.preview.png"
    png.symlink_to(victim)
    write_preview(packed_decoded.path, png, n=4)
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert not png.is_symlink()
    assert png.read_bytes().startswith(b"\x89PNG")
    dest = tmp_path / "dest" / "x.h5.preview.png"
    dest.parent.mkdir()
    dest.symlink_to(victim)
    Location.of(dest).put(local=png)
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert dest.read_bytes() == png.read_bytes()


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo"])
def test_publish_cleanup_never_follows_or_removes_a_planted_temp(
    tmp_path: Path, victim: Path, kind: str
) -> None:
    planted = tmp_path / ".asset.h5.tmp-0123456789ab"
    if kind == "fifo":
        os.mkfifo(planted)
    else:
        _plant(kind, planted, victim)
    dead = tmp_path / ".asset.h5.tmp-deaddeaddead"  # a killed publisher's temp: removed
    dead.write_bytes(b"partial copy")
    with folder_lock(str(tmp_path)):
        remove_stale_temps(str(tmp_path), "asset.h5")  # would hang on a FIFO it opened
    assert victim.read_bytes() == b"precious bytes that must never change"
    assert planted.is_symlink() or planted.exists()
    assert not dead.exists()


def test_a_publisher_killed_mid_copy_leaves_no_name_behind(tmp_path: Path) -> None:
    """The copy is written without a name and named only once complete: nothing to clean up."""
    folder = tmp_path / "out"
    folder.mkdir()
    source = tmp_path / "source.fifo"  # the copy blocks on it, mid-write, for as long as we like
    os.mkfifo(source)
    code = (
        "import sys; from h5forge.location import Location;"
        "Location.of(sys.argv[1]).put(local=sys.argv[2])"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(folder / "asset.h5"), str(source)])
    try:
        with open(source, "wb") as feed:
            feed.write(b"x" * (4 << 20))  # returns once the child has read most of it
            feed.flush()
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL
    assert os.listdir(folder) == []


def test_a_folder_named_like_a_staging_leftover_survives(tmp_path: Path, victim: Path) -> None:
    dest = tmp_path / "data"
    users = tmp_path / "data.staging-000000000000"
    users.mkdir()
    (users / "keep.txt").write_bytes(b"mine")
    linked = tmp_path / "data.old-111111111111"
    linked.symlink_to(users)
    dead = new_staging(dest)  # marked, as a killed extraction would leave it
    (dead / "half.jpg").write_bytes(b"x")
    (dead / "escape").symlink_to(victim)
    with exclusive(dest):
        pass
    assert (users / "keep.txt").read_bytes() == b"mine"
    assert linked.is_symlink()
    assert not dead.exists()
    assert victim.read_bytes() == b"precious bytes that must never change"


def test_a_symlinked_fetch_lock_is_refused(tmp_path: Path, victim: Path) -> None:
    dest = tmp_path / "data"
    (tmp_path / "data.lock").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="a symbolic link to"), exclusive(dest):
        pass
    assert victim.read_bytes() == b"precious bytes that must never change"


def test_the_marker_stays_until_a_folder_becomes_the_destination(tmp_path: Path) -> None:
    """fetch extracts into DEST.incoming-<token> (itself committed from a staging folder) and
    then commits that to DEST: the intermediate stays marked (a kill then leaves a removable
    leftover), the destination never holds the marker."""
    dest = tmp_path / "dest"
    incoming = tmp_path / "dest.incoming-0123456789ab"
    staging = new_staging(incoming)
    (staging / "a.jpg").write_bytes(b"x")
    commit(staging, incoming, replace=False)
    assert files.is_ours(incoming, "staging")
    commit(incoming, dest, replace=False)
    assert sorted(p.name for p in dest.iterdir()) == ["a.jpg"]
    again = new_staging(dest)
    (again / "b.jpg").write_bytes(b"y")
    commit(again, dest, replace=True)  # the old dest is marked once renamed aside, then gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
    assert sorted(p.name for p in dest.iterdir()) == ["b.jpg"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_open_regular_never_waits_on_a_fifo_and_refuses_what_is_not_a_file(
    tmp_path: Path,
) -> None:
    """Issue 28, class 3: the one way a file in a tree others can write is opened by name."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer ever comes: a blocking open would hang here
    with pytest.raises(ValueError, match=r"part '.*fifo' is a FIFO \(named pipe\), not a regular"):
        files.open_regular(fifo, "part")
    with pytest.raises(ValueError, match="is a folder, not a regular file"):
        files.open_regular(tmp_path, "part")
    with pytest.raises(FileNotFoundError):
        files.open_regular(tmp_path / "absent", "part")
    (tmp_path / "file").write_bytes(b"bytes")
    fd = files.open_regular(tmp_path / "file", "part")
    try:
        assert os.read(fd, 10) == b"bytes"
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=3000),
    chunk=st.integers(1, 1100),
    size=st.one_of(st.none(), st.integers(0, 3500)),
)
def test_sha256_fd_hashes_the_first_size_bytes_in_any_chunking(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, chunk: int, size: int | None
) -> None:
    """One reused buffer, any chunk: the same digest as hashing the bytes at once, and the
    count of bytes hashed (short when the file is), wherever the descriptor's position was."""
    path = tmp_path_factory.mktemp("sha") / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        want = data if size is None else data[:size]
        assert files.sha256_fd(fd, size, chunk) == (hashlib.sha256(want).hexdigest(), len(want))
    finally:
        os.close(fd)


def test_a_lock_released_while_another_run_opens_it_is_taken_not_refused(
    tmp_path: Path,
) -> None:
    """A holder removes its lock file on release; a run that opened the file just before (a
    name with no link left) opens the name again, as when it finds the file gone after its
    ``flock``, instead of refusing it as a file h5forge did not make. Two threads take and
    release one lock in turns, as two workers completing one cache entry do."""
    import threading

    lock, rounds, errors = str(tmp_path / "entry.lock"), 400, []

    def run() -> None:
        try:
            for _ in range(rounds):
                with lock_file(lock, target="the entry"):
                    pass
        except Exception as e:  # reported below, with the thread's name
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not os.path.exists(lock)
