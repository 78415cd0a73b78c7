"""Campaign 6 — concurrency: racing publishers, and readers and re-verifiers during a publish.

Three small assets (A0, A1, A2: same classes, different images) are packed once. Each trial
starts processes (fork) at one gate:

* ``replace``: the destination holds A0; two publishers replace it with A1 and A2 at once
  (``overwrite=True``). Both must succeed; the end state is A1 or A2, whole, with its sidecar.
* ``first-wins``: the destination is empty; two publishers publish A1 and A2 without
  ``overwrite``. Exactly one succeeds; the other gets ``FileExistsError``; the end state is the
  winner's.
* ``same-bytes``: two publishers publish A1 at once; both succeed (one may find it unchanged).

While the publishers run, two readers open ``H5ImageDataset(dest, verify_reads=True)`` over and
over and read every sample: each read must be one asset, whole (its sample count and digests
those of A0, A1 or A2, and no IntegrityError). A re-verifier runs ``verify`` and compares the
result with the sidecar read just before and just after: when the sidecar did not change in
between, the verified file must be the one it describes (otherwise the sidecar disagreed with
its file: torn). The destination is checked at the end: a sidecar matching its file, verifying.

Packs to one output (``h5forge pack`` processes, :data:`PACK_KINDS`):

* ``pack-race``: two packs to one output started at once. Exactly one succeeds; the other exits
  2 with a message naming the output and the winner's pid (or, had the winner already finished,
  that the output exists) and no traceback; the winner's file verifies; nothing else is left.
* ``pack-killed``: a pack with two workers is killed with SIGKILL — the main process only, at
  a random moment once its workers run. Within 2 s no process it started (workers, fork server,
  resource tracker) may be left; a second pack then succeeds (it takes over the dead run's lock
  and removes the partial that run recorded), verifies, and leaves only the output.

Full campaign only: two ``h5forge build`` runs to one destination at once (Prefect server).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.sidecar import read_sidecar
from h5forge.publish.storage import publish

# Imported here, before the children fork, so they start at once (torch takes seconds).
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.fixtures.processes import descendants, survivors
from tests.reliability._result import CampaignResult

__all__ = [
    "KINDS",
    "PACK_KINDS",
    "make_assets",
    "make_pack_source",
    "run",
    "run_pack_trial",
    "run_trial",
]

KINDS = ("replace", "first-wins", "same-bytes")
PACK_KINDS = ("pack-race", "pack-killed")


def make_assets(work: Path) -> dict[str, Path]:
    """Three different sealed assets of the same classes (a few MB each)."""
    out = {}
    for i, name in enumerate(("A0", "A1", "A2")):
        src = work / f"src-{name}"
        path = work / f"{name}.h5"
        if not path.exists():
            write_image_folder(
                src,
                classes=("x", "y"),
                per_class=60 + 10 * i,
                seed=100 + i,
                size=(48, 48),
                formats=("png",),
            )
            pack(
                src, path, config=PackConfig(ImageConfig(resize="resize", size=(96, 96))), workers=1
            )
            shutil.rmtree(src)
        out[name] = path
    return out


def _fingerprint(path: Path) -> dict[str, Any]:
    import h5py

    with h5py.File(path, "r") as h5:
        digests = h5["digests"][()]
    return {
        "sha256": Location.of(path).sha256(),
        "n": len(digests),
        "digests": hashlib.sha256(digests.tobytes()).hexdigest(),
    }


# --------------------------------------------------------------------------- processes


def _publisher(gate: Any, src: str, dest: str, overwrite: bool, out: Any) -> None:
    gate.wait()
    try:
        r = publish(src, dest, overwrite=overwrite)
        out.put(("publish", src, "unchanged" if r.unchanged else "published", "", 1))
    except FileExistsError as e:
        out.put(("publish", src, "FileExistsError", str(e)[:120], 1))
    except Exception as e:  # noqa: BLE001 - reported to the parent, classified there
        out.put(("publish", src, type(e).__name__, str(e)[:300], 1))


class _Tally:
    """Outcome counts kept in a child and sent once at the end (a queue fed on every event
    fills its pipe, and a child then cannot exit until the parent drains it)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.counts: dict[str, int] = {}
        self.details: dict[str, str] = {}

    def add(self, result: str, detail: str = "") -> None:
        self.counts[result] = self.counts.get(result, 0) + 1
        self.details.setdefault(result, detail)

    def send(self, out: Any) -> None:
        for result, n in self.counts.items():
            out.put((self.what, "", result, self.details[result], n))


def _reader(gate: Any, stop: Any, dest: str, known: dict[str, int], out: Any) -> None:
    tally = _Tally("read")
    gate.wait()
    while not stop.is_set():
        try:
            ds = H5ImageDataset(dest, verify_reads=True)
        except FileNotFoundError:
            tally.add("absent")
            continue
        except Exception as e:  # noqa: BLE001 - reported to the parent, classified there
            tally.add(type(e).__name__, str(e)[:300])
            continue
        try:
            n = len(ds)
            for start in range(0, n, 32):
                ds.__getitems__(list(range(start, min(n, start + 32))))
            tally.add("whole" if n in known.values() else "UNKNOWN COUNT", str(n))
        except Exception as e:  # noqa: BLE001
            tally.add(type(e).__name__, str(e)[:300])
        finally:
            ds.close()
    tally.send(out)


def _reverifier(gate: Any, stop: Any, dest: str, out: Any) -> None:
    tally = _Tally("reverify")
    gate.wait()
    while not stop.is_set():
        try:
            before = read_sidecar(dest)
        except FileNotFoundError:
            tally.add("not published")
            continue
        try:
            report = verify(dest)
        except FileNotFoundError:
            tally.add("absent")
            continue
        except Exception as e:  # noqa: BLE001
            tally.add(type(e).__name__, str(e)[:300])
            continue
        try:
            after = read_sidecar(dest)
        except FileNotFoundError:
            after = None
        if after != before:
            tally.add("sidecar changed meanwhile")
        elif report.sha256 != before["sha256"]:
            tally.add("TORN", f"sidecar {before['sha256']} stayed, file is {report.sha256}")
        else:
            tally.add("matches its sidecar")
    tally.send(out)


def run_trial(
    kind: str, assets: dict[str, Path], work: Path, k: int, rng: random.Random
) -> tuple[dict[str, int], list[str]]:
    """One race; returns (observation -> count, problems)."""
    ctx = mp.get_context("fork")
    box = work / f"race-{k}"
    shutil.rmtree(box, ignore_errors=True)
    box.mkdir()
    dest = box / "asset.h5"
    if kind == "replace":
        publish(assets["A0"], str(dest))
    srcs = [assets["A1"], assets["A1"] if kind == "same-bytes" else assets["A2"]]
    overwrite = kind == "replace"
    known = {name: _fingerprint(p)["n"] for name, p in assets.items()}
    gate, stop, out = ctx.Barrier(5), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_publisher, args=(gate, str(s), str(dest), overwrite, out)) for s in srcs
    ]
    procs += [
        ctx.Process(target=_reader, args=(gate, stop, str(dest), known, out)) for _ in range(2)
    ]
    procs.append(ctx.Process(target=_reverifier, args=(gate, stop, str(dest), out)))
    for p in procs:
        p.start()
    for p in procs[:2]:
        p.join(timeout=120)
    time.sleep(rng.uniform(0.1, 0.4))  # readers see the settled state too
    stop.set()
    events = [out.get(timeout=120) for _ in range(2)]  # the publishers' results
    for p in procs[2:]:
        p.join(timeout=120)
    while not out.empty():
        events.append(out.get(timeout=5))
    problems: list[str] = []
    seen: dict[str, int] = {}
    for what, src, result, detail, n in events:
        key = f"{what}: {result}"
        seen[key] = seen.get(key, 0) + n
        if (
            result in ("IntegrityError", "TORN", "UNKNOWN COUNT")
            or (what == "publish" and result not in ("published", "unchanged", "FileExistsError"))
            or (
                what != "publish"
                and result
                not in (
                    "whole",
                    "absent",
                    "not published",
                    "matches its sidecar",
                    "sidecar changed meanwhile",
                )
            )
        ):
            problems.append(f"{kind}: {what} {Path(src).name if src else ''} -> {result}: {detail}")
    pubs = [r for w, _, r, _, _ in events if w == "publish"]
    if kind == "first-wins" and sorted(pubs) != ["FileExistsError", "published"]:
        problems.append(
            f"first-wins: publishers ended {pubs}, expected one published and one FileExistsError"
        )
    if kind != "first-wins" and any(r not in ("published", "unchanged") for r in pubs):
        problems.append(f"{kind}: publishers ended {pubs}, expected both to succeed")
    final = read_sidecar(str(dest))
    fp = _fingerprint(dest)
    if final["sha256"] != fp["sha256"]:
        problems.append(f"{kind}: final sidecar {final['sha256']} != file {fp['sha256']}")
    if fp["sha256"] not in {_fingerprint(s)["sha256"] for s in srcs}:
        problems.append(f"{kind}: the final file is none of the published assets")
    if not problems:
        shutil.rmtree(box, ignore_errors=True)
    return seen, problems


def make_pack_source(work: Path) -> Path:
    """An image folder whose pack takes a few seconds (long enough to race and to kill)."""
    src = work / "pack-src"
    if not src.exists():
        write_image_folder(
            src, classes=("x", "y"), per_class=200, seed=7, size=(120, 160), formats=("png",)
        )
    return src


def _pack_cmd(src: Path, out: Path, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "h5forge.cli",
        "pack",
        str(src),
        str(out),
        "--size",
        "64",
        "--resize",
        "resize",
        "--workers",
        str(workers),
    ]


def _leftovers(box: Path, out: Path) -> list[str]:
    return sorted(p.name for p in box.iterdir() if p != out)


def run_pack_trial(
    kind: str, src: Path, work: Path, k: int, rng: random.Random
) -> tuple[dict[str, int], list[str]]:
    """One pack race or kill; returns (observation -> count, problems)."""
    box = work / f"pack-{k}"
    shutil.rmtree(box, ignore_errors=True)
    box.mkdir()
    out = box / "out.h5"
    seen: dict[str, int] = {}
    problems: list[str] = []
    if kind == "pack-race":
        procs = [
            subprocess.Popen(
                _pack_cmd(src, out, 1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        ends = [
            (p.pid, p.returncode, err) for p in procs for _, err in [p.communicate(timeout=300)]
        ]
        codes = sorted(code for _, code, _ in ends)
        for pid, code, err in ends:
            other = next(q for q, _, _ in ends if q != pid)
            if code == 0:
                seen["pack: won"] = seen.get("pack: won", 0) + 1
            elif code == 2 and f"another h5forge run (pid {other}" in err:
                seen["pack: refused, busy (names the winner)"] = (
                    seen.get("pack: refused, busy (names the winner)", 0) + 1
                )
            elif code == 2 and "exists" in err:
                seen["pack: refused, output exists"] = (
                    seen.get("pack: refused, output exists", 0) + 1
                )
            else:
                problems.append(f"pack-race: pid {pid} exited {code}: {err[-400:]}")
            if "Traceback" in err:
                problems.append(f"pack-race: pid {pid} printed a traceback: {err[-400:]}")
        if codes != [0, 2]:
            problems.append(f"pack-race: exit codes {codes}, expected one 0 and one 2")
    else:
        proc = subprocess.Popen(
            _pack_cmd(src, out, 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        tree: dict[int, int] = {}
        while len(tree) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            tree = descendants(proc.pid)  # workers, fork server, resource tracker
        # Soon after the workers exist: a small pack on an idle machine is done within a second.
        time.sleep(rng.uniform(0.0, 0.15))
        tree.update(descendants(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.returncode != -signal.SIGKILL:
            problems.append(f"pack-killed: the pack ended ({proc.returncode}) before the kill")
        left = survivors(tree, within=2.0)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        key = "kill: no process left" if not left else "kill: PROCESSES LEFT"
        seen[key] = 1
        if left:
            problems.append(
                f"pack-killed: {len(left)} of {len(tree)} processes it started "
                f"still ran 2 s after the kill: {sorted(left)}"
            )
        seen["kill: left " + (", ".join(_leftovers(box, out)) or "nothing")] = 1
        again = subprocess.run(_pack_cmd(src, out, 2), capture_output=True, text=True, timeout=300)
        if again.returncode != 0:
            problems.append(
                f"pack-killed: the re-run exited {again.returncode}: {again.stderr[-400:]}"
            )
        else:
            seen["re-run: packed"] = 1
    if out.exists():
        try:
            verify(str(out))
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            problems.append(f"{kind}: the output does not verify: {type(e).__name__}: {e}")
    else:
        problems.append(f"{kind}: no output")
    if _leftovers(box, out):
        problems.append(f"{kind}: left beside the output: {_leftovers(box, out)}")
    if not problems:
        shutil.rmtree(box, ignore_errors=True)
    return seen, problems


def run(
    *,
    trials: int = 30,
    seed: int = 0,
    work: Path,
    builds: Callable[[CampaignResult], None] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """``trials`` races, round-robin over :data:`KINDS`; then the build races if given."""
    t0 = time.perf_counter()
    res = CampaignResult("concurrency")
    rng = random.Random(seed)
    assets = make_assets(work)
    totals: dict[str, int] = {}
    for k in range(trials):
        kind = KINDS[k % len(KINDS)]
        seen, problems = run_trial(kind, assets, work, k, rng)
        for key, n in seen.items():
            totals[key] = totals.get(key, 0) + n
        lost = any(
            "TORN" in p or "!=" in p or "none of" in p or "IntegrityError" in p for p in problems
        )
        res.record(
            f"race {kind}: {'clean' if not problems else 'PROBLEM'}",
            detected=not problems,
            lost=lost,
            problem="\n    ".join(problems) if problems else None,
        )
        log(
            f"  race {k} {kind}: {json.dumps(seen, sort_keys=True)}"
            f"{' PROBLEMS' if problems else ''}"
        )
    res.notes.append(
        "observations over all races: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()))
    )
    src = make_pack_source(work)
    pack_totals: dict[str, int] = {}
    for k in range(max(2, trials // 3)):
        kind = PACK_KINDS[k % len(PACK_KINDS)]
        seen, problems = run_pack_trial(kind, src, work, k, rng)
        for key, n in seen.items():
            pack_totals[key] = pack_totals.get(key, 0) + n
        res.record(
            f"{kind}: {'clean' if not problems else 'PROBLEM'}",
            detected=not problems,
            lost=any("does not verify" in p for p in problems),
            problem="\n    ".join(problems) if problems else None,
        )
        log(f"  {kind} {k}: {json.dumps(seen, sort_keys=True)}{' PROBLEMS' if problems else ''}")
    res.notes.append(
        "observations over all pack trials: "
        + ", ".join(f"{k} {v}" for k, v in sorted(pack_totals.items()))
    )
    if builds is not None:
        builds(res)
    res.seconds = time.perf_counter() - t0
    return res
