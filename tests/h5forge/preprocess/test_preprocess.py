"""Tests for h5forge.preprocess.pool: order, bounded work in flight, clean shutdown."""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from h5forge.demo import write_image_folder
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Processed, Quarantined, process_file
from h5forge.preprocess.pool import iter_processed
from tests.fixtures.images import BadImages
from tests.fixtures.processes import descendants, survivors

CFG = ImageConfig(size=(16, 16))


def _inputs(image_folder: Path, bad_images: BadImages) -> list[str]:
    good = sorted(str(p) for p in image_folder.rglob("*.*"))
    bad = sorted(str(p) for p in bad_images.folder.iterdir())
    mixed = [p for pair in zip(good, bad, strict=False) for p in pair]
    return mixed + good[len(bad) :] + bad[len(good) :]


def _new_children(before: set[int | None]) -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.pid not in before]


def test_results_come_in_input_order(image_folder: Path, bad_images: BadImages) -> None:
    paths = _inputs(image_folder, bad_images)
    assert len(paths) == 29
    results = list(iter_processed(paths, CFG, workers=2))
    assert [r.index for r in results] == list(range(len(paths)))
    assert results == [process_file(i, p, CFG) for i, p in enumerate(paths)]
    assert sum(isinstance(r, Quarantined) for r in results) == 6
    assert list(iter_processed([Path(p) for p in paths], CFG, workers=1)) == results


def test_threads_give_the_same_results_in_order_without_processes(
    image_folder: Path, bad_images: BadImages
) -> None:
    paths = _inputs(image_folder, bad_images)
    before = {p.pid for p in multiprocessing.active_children()}
    results = list(iter_processed(paths, CFG, workers=2, window=3, threads=True))
    assert results == [process_file(i, p, CFG) for i, p in enumerate(paths)]
    assert sum(isinstance(r, Quarantined) for r in results) == 6
    assert not _new_children(before)
    gen = iter_processed(paths, CFG, workers=2, window=3, threads=True)
    assert next(gen).index == 0
    gen.close()  # stops early: pending work cancelled, the threads end
    assert not [t for t in threading.enumerate() if t.name.startswith("h5forge-preprocess")]


def test_tiny_inputs_run_in_process(image_folder: Path) -> None:
    paths = sorted(str(p) for p in image_folder.rglob("*.jpg"))[:3]
    before = {p.pid for p in multiprocessing.active_children()}
    results = list(iter_processed(paths, CFG, workers=4))
    assert [r.index for r in results] == [0, 1, 2]
    assert all(isinstance(r, Processed) for r in results)
    assert not _new_children(before)
    assert list(iter_processed([], CFG)) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "workers=0 must be an int >= 1"),
        ({"workers": True}, "workers=True"),
        ({"window": 0}, "window=0 must be an int >= 1"),
        ({"window": 2.5}, "window=2.5"),
    ],
)
def test_bad_arguments_fail_before_any_work(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        iter_processed(["never-read.jpg"], CFG, **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.timeout(60)
def test_work_in_flight_never_exceeds_the_window(tmp_path: Path) -> None:
    # Every input is a named pipe: a worker that starts on input i blocks opening it until the
    # feeder thread sees the waiting reader and writes the image. The feeder thus learns which
    # inputs were started, and when, without relying on timing for correctness.
    src = write_image_folder(
        tmp_path / "src", classes=("a",), per_class=1, size=(12, 12), formats=("png",)
    )[0]
    data = src.read_bytes()
    n, window = 40, 8
    fifos = [str(tmp_path / f"{i:03d}.png") for i in range(n)]
    for f in fifos:
        os.mkfifo(f)
    consumed = [0]
    started: list[int] = []
    violations: list[tuple[int, int]] = []
    done = threading.Event()

    def feeder() -> None:
        waiting = set(range(n))
        while waiting and not done.is_set():
            for i in sorted(waiting):
                try:
                    fd = os.open(fifos[i], os.O_WRONLY | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno != errno.ENXIO:  # ENXIO: nobody is reading this pipe yet
                        raise
                    continue
                if i >= consumed[0] + window:
                    violations.append((i, consumed[0]))
                os.set_blocking(fd, True)
                os.write(fd, data)
                os.close(fd)
                started.append(i)
                waiting.discard(i)
            time.sleep(0.002)

    thread = threading.Thread(target=feeder, daemon=True)
    thread.start()
    it = iter_processed(fifos, CFG, workers=2, window=window)
    try:
        assert next(it).index == 0
        consumed[0] = 1
        time.sleep(1.0)  # consumer paused: an unbounded pool would start everything now
        assert 1 <= len(started) <= window
        for expected, r in enumerate(it, start=1):
            assert r.index == expected
            assert isinstance(r, Processed)
            consumed[0] += 1
    finally:
        done.set()
        thread.join(10)
    assert consumed[0] == n
    assert sorted(started) == list(range(n))
    assert violations == []


def test_borrowed_samples_stay_intact_until_borrow_more_were_asked_for(
    image_folder: Path,
) -> None:
    """With ``borrow=k`` the consumer keeps the views of its last k - 1 results while it asks
    for the next: no worker writes into their slots meanwhile, though the window is small and
    the consumer slow (the workers wait for slots)."""
    paths = sorted(str(p) for p in image_folder.rglob("*.*")) * 4
    held: collections.deque[Processed] = collections.deque(maxlen=4)
    seen = 0
    for r in iter_processed(paths, CFG, workers=2, window=6, borrow=4):
        assert isinstance(r, Processed)
        assert isinstance(r.data, memoryview)  # from the ring, not a copy
        held.append(r)
        time.sleep(0.005)  # the workers race ahead as far as the slots let them
        for kept in held:
            assert hashlib.sha256(kept.data).digest() == kept.digest, (seen, kept.index)
        seen += 1
    assert seen == len(paths)


@pytest.mark.parametrize("borrow", [-1, 1.5, "2"])
def test_borrow_must_be_a_count(image_folder: Path, borrow: object) -> None:
    with pytest.raises(ValueError, match="borrow="):
        iter_processed([str(image_folder)], CFG, borrow=borrow)  # type: ignore[arg-type]


def test_closing_early_stops_the_workers(image_folder: Path) -> None:
    paths = sorted(str(p) for p in image_folder.rglob("*.*")) * 4
    before = {p.pid for p in multiprocessing.active_children()}
    it = iter_processed(paths, CFG, workers=2, window=4)
    assert [next(it).index, next(it).index] == [0, 1]
    workers = _new_children(before)
    assert workers
    it.close()
    assert not any(p.is_alive() for p in workers)
    assert not _new_children(before)


def test_consumer_error_stops_the_workers(image_folder: Path) -> None:
    paths = sorted(str(p) for p in image_folder.rglob("*.*")) * 4
    before = {p.pid for p in multiprocessing.active_children()}
    workers: list[multiprocessing.process.BaseProcess] = []

    def consume() -> None:
        for r in iter_processed(paths, CFG, workers=2):
            workers.extend(_new_children(before))
            if r.index == 3:
                raise KeyError("consumer failed")

    with pytest.raises(KeyError, match="consumer failed"):
        consume()
    assert workers
    assert not any(p.is_alive() for p in workers)
    assert not _new_children(before)


def test_a_script_read_from_stdin_gets_the_fix_not_dead_workers(image_folder: Path) -> None:
    # forkserver/spawn children re-run __main__ from its file; '<stdin>' is none.
    import subprocess
    import sys

    script = (
        "from h5forge.preprocess.config import ImageConfig\n"
        "from h5forge.preprocess.pool import iter_processed\n"
        f"paths = sorted(str(p) for p in __import__('pathlib').Path({str(image_folder)!r})"
        ".rglob('*.*'))\n"
        "list(iter_processed(paths, ImageConfig(size=(16, 16)), workers=2))\n"
    )
    done = subprocess.run(
        [sys.executable, "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "'<stdin>' is not a file" in done.stderr
    assert "pass workers=1" in done.stderr
    ok = subprocess.run(
        [sys.executable, "-"],
        input=script.replace("workers=2", "workers=1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr


_POOLS_TWICE = """
import multiprocessing, sys
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.pool import iter_processed
from h5forge.preprocess.workers import worker_context
if sys.argv[2] != "none":
    multiprocessing.set_start_method(sys.argv[2])
paths = sys.argv[3:]
for _ in range(2):
    assert len(list(iter_processed(paths, ImageConfig(size=(32, 32)), workers=2))) == len(paths)
    print(multiprocessing.get_start_method(allow_none=True), worker_context().get_start_method())
"""


@pytest.mark.skipif(
    multiprocessing.get_all_start_methods()[0] != "fork"
    or "forkserver" not in multiprocessing.get_all_start_methods(),
    reason="the platform's default start method is not fork",
)
@pytest.mark.parametrize(
    ("chosen", "after"), [("none", "None forkserver"), ("spawn", "spawn spawn")]
)
def test_a_pool_leaves_the_start_method_as_it_found_it(
    image_folder: Path, chosen: str, after: str
) -> None:
    """Starting forkserver workers makes Python choose fork for the whole process (before
    3.14); the next pool then forked the parent. Each pool undoes that choice, never the
    caller's own."""
    paths = sorted(str(p) for p in image_folder.rglob("*.*"))[:8]
    run = subprocess.run(
        [sys.executable, "-c", _POOLS_TWICE, "x", chosen, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == [after, after]


_PACK = """
import sys
from h5forge.preprocess.config import ImageConfig
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
config = PackConfig(ImageConfig(resize="resize", size=(64, 64)))
pack(sys.argv[1], sys.argv[2], config=config, workers=2)
"""


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_killing_only_the_main_pack_process_takes_its_workers_with_it(
    tmp_path: Path, method: str
) -> None:
    """SIGKILL of the pack alone (not its group): no worker, fork server or resource tracker
    may outlive it; left alone they would wait on the pool's queue forever."""
    src = tmp_path / "src"
    write_image_folder(
        src, classes=("a", "b"), per_class=150, seed=5, size=(120, 160), formats=("png",)
    )
    code = f"import multiprocessing; multiprocessing.set_start_method({method!r})\n" + _PACK
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(tmp_path / "o.h5")])
    try:
        deadline = time.monotonic() + 60
        tree: dict[int, int] = {}
        while len(tree) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            tree = descendants(proc.pid)
        assert len(tree) >= 2, f"the pack started no pool (exit code {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = survivors(tree, within=3.0)
        for pid in left:  # do not leak them into the rest of the run
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"still running 3 s after the pack was killed: {sorted(left)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the platform default on Linux")
def test_the_second_pack_of_a_process_starts_its_workers_as_the_first_did(tmp_path: Path) -> None:
    """Starting a fork-server worker pins the default start method to fork as a side effect
    (CPython asks ``get_start_method()``); the pool of a second pack must not take that for a
    choice and fork the main process (its open files, the partial being written, included)."""
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=8, seed=5, size=(40, 50))
    code = (
        "import multiprocessing, sys\n"
        "from h5forge.pack.writer import pack\n"
        "from h5forge.preprocess.workers import worker_context\n"
        "if __name__ == '__main__':\n"
        "    seen = []\n"
        "    for k in range(2):\n"
        "        pack(sys.argv[1], f'{sys.argv[2]}/{k}.h5', workers=2)\n"
        "        seen.append(worker_context().get_start_method())\n"
        "    print(multiprocessing.get_start_method(allow_none=True), *seen)\n"
    )
    script = tmp_path / "twice.py"
    script.write_text(code)
    done = _run_script(script, src, tmp_path)
    pinned, first, second = done.stdout.split()
    assert pinned == "None"  # the pool undid the side effect
    assert first == second == "forkserver"


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the platform default on Linux")
def test_the_fork_server_imports_what_the_main_script_imports_once(tmp_path: Path) -> None:
    """Each forkserver worker runs the main script again; what the script imports is imported
    once, in the fork server, not again in every worker of every pack (a script importing the
    packer paid 0.15 s of CPU per worker and pack for it, Prefect over 1 s)."""
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b"), per_class=12, seed=5, size=(40, 50))
    lib = tmp_path / "lib"  # an installed package's place: on the path of every process
    lib.mkdir()
    (lib / "heavy_dep.py").write_text(
        "import os, pathlib\n"
        "with open(pathlib.Path(__file__).with_name('imports.txt'), 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "def helper():\n"
        "    return 1\n"
    )
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        "import heavy_dep\n"
        "from h5forge.pack.writer import pack\n"
        "if __name__ == '__main__':\n"
        "    for k in range(2):\n"
        "        r = pack(sys.argv[1], f'{sys.argv[2]}/{k}.h5', workers=2)\n"
        "        print(r.num_samples)\n"
        "    print(os.getpid())\n"
    )
    done = _run_script(
        script,
        src,
        tmp_path,
        env={**os.environ, "PYTHONPATH": f"{Path(__file__).resolve().parents[3]}{os.pathsep}{lib}"},
    )
    *counts, main_pid = done.stdout.split()
    assert counts == ["24", "24"]
    pids = (lib / "imports.txt").read_text().split()
    # The main process and the fork server; no worker imported it again (4 workers ran).
    assert len(pids) == 2, pids
    assert pids[0] == main_pid


def _run_script(
    script: Path, *args: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python script args...`` as a user runs a script; it must succeed."""
    done = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done


_EARLY = """
import multiprocessing, sys
from multiprocessing import forkserver
from h5forge.preprocess.workers import start_early
start_early(int(sys.argv[1]) or None)
server = forkserver._forkserver._forkserver_pid
print(server is not None, multiprocessing.get_start_method(allow_none=True), "torch" in sys.modules)
"""


@pytest.mark.skipif(
    multiprocessing.get_all_start_methods()[0] != "fork"
    or "forkserver" not in multiprocessing.get_all_start_methods(),
    reason="the platform's default start method is not fork",
)
@pytest.mark.parametrize(("workers", "started"), [(2, "True"), (None, "True"), (1, "False")])
def test_the_fork_server_starts_early_without_the_decoders_here(
    workers: int | None, started: str
) -> None:
    """The command line starts the fork server before it imports the packer: nothing heavy is
    imported in the caller for it, no start method is left chosen, and one worker starts none."""
    run = subprocess.run(
        [sys.executable, "-c", _EARLY, str(0 if workers is None else workers)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [started, "None", "False"]


_CTRL_C_AT_FORK_REQUEST = """
import signal, sys
from multiprocessing import reduction
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.pool import iter_processed

send = reduction.sendfds


def late(sock, fds):
    reduction.sendfds = send
    signal.raise_signal(signal.SIGINT)  # Ctrl-C once connected to the fork server, before asking
    return send(sock, fds)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job
    paths, cfg = sys.argv[1:], ImageConfig(size=(16, 16))
    print(len(list(iter_processed(paths, cfg, workers=2))))  # the fork server is up and serving
    reduction.sendfds = late
    try:
        list(iter_processed(paths, cfg, workers=2))
    except KeyboardInterrupt:
        print("interrupted")
    # The server takes requests in turn: it has read the interrupted one once this is served.
    print(len(list(iter_processed(paths, cfg, workers=2))))
"""


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here"
)
def test_ctrl_c_while_a_worker_is_asked_for_ends_the_run_without_a_traceback(
    image_folder: Path, tmp_path: Path
) -> None:
    """A KeyboardInterrupt between connecting to the fork server and sending it the request
    made the server die with a traceback (EOFError) on the terminal of an interrupted build
    (seen in CI); the interrupt now waits until the worker was asked for."""
    script = tmp_path / "interrupted.py"
    script.write_text(_CTRL_C_AT_FORK_REQUEST)
    paths = sorted(str(p) for p in image_folder.rglob("*.*"))
    run = subprocess.run(
        [sys.executable, str(script), *paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(len(paths)), "interrupted", str(len(paths))]
    assert "Traceback" not in run.stderr, run.stderr
