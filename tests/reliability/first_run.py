"""Campaign 8 — first contact: ``h5forge build`` on a fresh machine whose cores are busy.

What a new user meets first is Prefect's temporary local server: with no ``PREFECT_API_URL``,
``h5forge build`` and ``h5forge demo`` start one, and its first start in a new ``PREFECT_HOME``
creates its SQLite database. On a 2-core machine with a load of ~3 that took longer than
Prefect's default start-up bound of 20 s (issue 11: 2 of 11 builds and 1 of 6 re-runs after a
``kill -9`` failed with "Timed out while attempting to connect to ephemeral Prefect API server").

Every trial runs the real console command in a subprocess with a **fresh** ``PREFECT_HOME``, no
``PREFECT_API_URL`` and its own TMPDIR and cache, while one busy process per core spins (each
bounded in time, killed when the trial ends), on the built-in demo archive pinned by sha256:

- ``busy``: one build; it must exit 0 and publish an asset that verifies and matches its
  sidecar (300 samples, 2 quarantined).
- ``kill``: one build SIGKILLed at a random moment in the first ``kill_window`` seconds (at
  most 90% of the fastest ``busy`` build), which covers the server's first start and the
  stages after it — the command's process alone in
  even trials (``kill -9 PID``), its whole process group (the build, its temporary server, its
  workers) in odd ones. A command killed alone may leave nothing it started (the temporary
  server, the preprocessing workers) running for more than ``ORPHAN_BOUND_S``. Then the same
  command runs again in the same ``PREFECT_HOME`` (whatever the killed start left of its
  database) and must pass like a ``busy`` trial.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from h5forge.demo import make_demo_archive
from h5forge.location import Location
from h5forge.publish.sidecar import read_sidecar
from h5forge.verify.checks import verify
from tests.fixtures.processes import descendants, survivors
from tests.reliability._procs import REPO, base_env, run_cli
from tests.reliability._result import CampaignResult

__all__ = ["busy_cores", "run", "run_busy", "run_kill"]

EXPECTED = {"num_samples": 300, "num_quarantined": 2}
# A build that has not finished after this long failed (a hang is a failure, not a wait).
BUILD_TIMEOUT_S = 600.0
# What a killed command leaves running (its temporary server, workers) must end within this.
ORPHAN_BOUND_S = 10.0
_SPIN = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy_cores(n: int | None = None, *, limit_s: float = BUILD_TIMEOUT_S) -> Iterator[int]:
    """Keep ``n`` processes (default: one per core) spinning; each stops by itself after
    ``limit_s`` and all are killed on exit. Yields how many were started."""
    n = n or os.cpu_count() or 2
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN.format(limit=limit_s)], stdin=subprocess.DEVNULL
        )
        for _ in range(n)
    ]
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _fresh(work: Path, name: str) -> tuple[dict[str, str], Path]:
    box = work / name
    if box.exists():
        shutil.rmtree(box)
    box.mkdir(parents=True)
    env = base_env(box, None)  # no PREFECT_API_URL: the build starts its own temporary server
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)  # the CLI's own bound
    return env, box


def _build_args(archive: Path, sha: str, box: Path) -> list[str]:
    return [
        "build",
        str(archive),
        str(box / "out" / "demo.h5"),
        "--sha256",
        sha,
        "--cache-dir",
        str(box / "cache"),
        "--smoke-batches",
        "2",
    ]


def _check_published(dest: Path) -> str | None:
    """None when ``dest`` is a complete, verified, committed asset; else what is wrong."""
    if not dest.exists():
        return f"no asset at {dest}"
    try:
        sidecar = read_sidecar(str(dest))
        report = verify(str(dest))
    except (OSError, ValueError) as e:
        return f"asset at {dest} does not check: {type(e).__name__}: {e}"
    if sidecar.get("sha256") != report.sha256:
        return f"sidecar sha256 {sidecar.get('sha256')} != file {report.sha256}"
    got = {"num_samples": report.num_samples, "num_quarantined": sidecar.get("num_quarantined")}
    if got != EXPECTED:
        return f"asset holds {got}, expected {EXPECTED}"
    return None


def _run_to_end(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, float, str]:
    w = run_cli(args, env, cwd)
    try:
        rc = w.finish(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - w.t0, w.text
    return rc, time.perf_counter() - w.t0, w.text


def _cmdlines(pids: dict[int, int]) -> str:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f"{pid}: " + f.read().replace(b"\0", b" ").decode()[:100])
        except OSError:
            out.append(f"{pid}: (gone)")
    return "; ".join(out)


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def run_busy(i: int, archive: Path, sha: str, work: Path, res: CampaignResult) -> float:
    """One build with a fresh PREFECT_HOME on busy cores; returns its wall time."""
    env, box = _fresh(work, f"busy-{i:02d}")
    with busy_cores():
        load = os.getloadavg()[0]
        rc, seconds, text = _run_to_end(_build_args(archive, sha, box), env, box)
    problem = (
        f"busy build exited {rc} after {seconds:.0f} s: {_tail(text)}"
        if rc
        else _check_published(box / "out" / "demo.h5")
    )
    res.record(
        "fresh PREFECT_HOME, cores busy: build passed"
        if problem is None
        else "fresh PREFECT_HOME, cores busy: build FAILED",
        detected=problem is None,
        problem=f"busy trial {i}: {problem}" if problem else None,
    )
    res.notes.append(f"busy trial {i}: exit {rc} in {seconds:.1f} s (load {load:.1f})")
    return seconds


def run_kill(
    i: int,
    archive: Path,
    sha: str,
    work: Path,
    res: CampaignResult,
    rng: random.Random,
    kill_window: float,
) -> None:
    """SIGKILL a build at a random moment, then run it again in the same PREFECT_HOME."""
    env, box = _fresh(work, f"kill-{i:02d}")
    args = _build_args(archive, sha, box)
    delay = rng.uniform(0.5, kill_window)
    only_main = i % 2 == 0  # even trials kill the command alone, as `kill -9 PID` does
    left: dict[int, int] = {}
    left_what = ""
    with busy_cores():
        w = run_cli(args, env, box)
        time.sleep(delay)
        finished_first = w.proc.poll() is not None
        if only_main and not finished_first:
            started = descendants(w.proc.pid)
            os.kill(w.proc.pid, signal.SIGKILL)
            # Its temporary server and its workers must end with it, not linger orphaned.
            left = survivors(started, within=ORPHAN_BOUND_S)
            left_what = _cmdlines(left)  # read before the group kill below ends them
        w.kill()  # the rest of the group, if anything is left (checked above)
        rc, seconds, text = _run_to_end(args + ["--overwrite"], env, box)
    problem = (
        f"re-run exited {rc} after {seconds:.0f} s: {_tail(text)}"
        if rc
        else _check_published(box / "out" / "demo.h5")
    )
    if left:
        problem = (
            f"{len(left)} processes of the killed command outlived it by "
            f"{ORPHAN_BOUND_S:.0f} s: {left_what}"
        )
    where = (
        "after it finished"
        if finished_first
        else f"{'the command alone' if only_main else 'its process group'} at {delay:.1f} s"
    )
    res.record(
        "kill -9, then re-run in the same PREFECT_HOME: passed"
        if problem is None
        else "kill -9, then re-run: FAILED",
        detected=problem is None,
        problem=f"kill trial {i} (killed {where}): {problem}" if problem else None,
    )
    res.notes.append(f"kill trial {i}: killed {where}; re-run exit {rc} in {seconds:.1f} s")


def run(
    *,
    busy: int = 5,
    kills: int = 10,
    seed: int = 0,
    work: Path,
    kill_window: float = 40.0,
    log: Callable[[str], None] = lambda _: None,
) -> CampaignResult:
    """Run ``busy`` fresh builds on busy cores and ``kills`` kill-then-re-run loops."""
    res = CampaignResult("first-run")
    archive = make_demo_archive(work / "source")
    sha = Location.of(archive).sha256()
    rng = random.Random(seed)
    t0 = time.perf_counter()
    took = []
    for i in range(busy):
        took.append(run_busy(i, archive, sha, work, res))
        log(f"busy {i}: {took[-1]:.1f} s, {res.outcomes}")
    if took:  # aim every kill inside a run: no later than 90% of the fastest build seen
        kill_window = min(kill_window, 0.9 * min(took))
        res.notes.append(f"kills land in the first {kill_window:.1f} s of a run")
    for i in range(kills):
        run_kill(i, archive, sha, work, res, rng, kill_window)
        log(f"kill {i}: {res.outcomes}")
    res.seconds = time.perf_counter() - t0
    res.notes.insert(
        0,
        f"{os.cpu_count()} CPUs, one busy process per core in every trial; "
        f"commands run from {REPO}",
    )
    return res
