"""A remote open never deadlocks on the garbage collector (h5py issue 2019).

h5py calls the file object with its global lock held, and a remote read waits on fsspec's IO
thread; freeing an h5py object takes that lock. A collection on the IO thread during that wait
that frees an h5py object left in a reference cycle (a refused file's traceback holds one)
would hang both threads forever. The scenario runs in a subprocess, so that a deadlock fails
the test instead of hanging the run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A loopback server that, on the first ranged read (made inside h5py.File, h5py's lock held),
# turns a reference cycle holding h5py objects into garbage and has fsspec's IO thread
# allocate with the collector's thresholds at 1: an automatic collection there, unless paused.
SCENARIO = r"""
import gc, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fsspec.asyn
import h5py
import numpy as np

from h5forge.asset.open import open_h5
from h5forge.location import Location

path, sized = sys.argv[1], sys.argv[2] == "sized"
with h5py.File(path, "w") as f:
    f["x"] = np.arange(1000)
data = open(path, "rb").read()


class Cycle:
    pass


def cycle_with_h5py_objects():
    c = Cycle()
    c.me, c.file = c, h5py.File(path, "r")
    c.dataset = c.file["x"]
    return c


kept = [cycle_with_h5py_objects()]
allocated = threading.Event()


def allocate_on_io_thread():
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        junk = [[] for _ in range(100)]
        del junk
    finally:
        gc.set_threshold(*old)
    allocated.set()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        if sized:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    def do_GET(self):
        rng = self.headers.get("Range")
        start, end = 0, len(data) - 1
        if rng:
            a, b = rng.split("=")[1].split("-")
            start, end = int(a), min(int(b), end) if b else end
            if kept:
                kept.clear()
                fsspec.asyn.get_loop().call_soon_threadsafe(allocate_on_io_thread)
                allocated.wait(10)
        body = data[start : end + 1]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/a.h5"
with open_h5(Location(url)) as h5:
    assert h5["x"][999] == 999
assert allocated.is_set() and not kept
print("opened")
"""


@pytest.mark.parametrize("size", ["sized", "unsized"])
def test_a_collection_on_the_io_thread_during_a_remote_open_does_not_deadlock(
    tmp_path: Path, size: str
) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCENARIO, str(tmp_path / "a.h5"), size],
            capture_output=True,
            text=True,
            timeout=120,  # a guard against the hang, not a measure: the open takes well under 1 s
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            "the remote open deadlocked: a collection on fsspec's IO thread freed an h5py "
            "object while h5py's lock was held by the reader waiting on that thread"
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "opened"
