"""Campaign 1 — crash safety: SIGKILL ``h5forge build`` at random moments of every stage.

The source is the built-in demo archive (``h5forge.demo.make_demo_archive``: 302 images, 2 of
them broken), pinned by its sha256; the destination is a local folder. All runs report to one
``prefect server start`` (a throw-away database), which saves the ~8-15 s a temporary server
costs every run.

A normal build is timed first (its log gives when each task finished). Each trial then starts the
same command in a fresh cache and temp folder and aims a kill at one stage — round-robin over
fetch, preprocess, pack, verify, publish and "anywhere" (uniform over the whole run) — at a
random delay inside that stage's measured window, counted from the log line that starts it (for
"pack", the short tail of the pack task: from the moment the ``.partial`` holds every image,
plus 0-0.15 s). The stage the kill really landed in is read back from what the process had
printed and, inside the pack task, from the size of the ``.partial``: still growing
(preprocess: images decoded and written as they come) or complete (pack: index, metadata
digest, self-verify, seal, rename). Half the
trials publish to an empty folder, half replace a published asset (``--overwrite``).

After each kill: every ``.h5`` in the destination either has a sidecar whose sha256 and size
match it and verifies, or has no sidecar (then ``read_sidecar`` refuses it: not published) and
is still a whole, sealed file; no sidecar exists without its file; a leftover ``.partial`` is
refused by ``verify`` and ``H5ImageDataset``. Then the same command runs again and must
complete; the result must verify, match its sidecar, hold the full dataset (300 samples, 2
quarantined), and the leftovers of the killed run (staging and incoming folders, temp files) must
be gone.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from h5forge.demo import make_demo_archive
from h5forge.errors import IntegrityError, UnsealedFileError
from h5forge.location import Location
from h5forge.publish.sidecar import read_sidecar
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.reliability._procs import REPO, Watched, base_env, run_cli
from tests.reliability._result import CampaignResult

__all__ = ["STAGES", "Baseline", "check_destination", "measure", "run", "run_trial"]

STAGES = ("fetch", "preprocess", "pack", "verify", "publish", "anywhere")
_TASKS = ("fetch", "discover", "pack", "verify", "smoke-load", "preview", "publish", "report")
_FINISHED = re.compile(r"Task run '([a-z-]+)\[.*' - Finished in state")
_BEGIN = "Beginning flow run"
_LEFTOVER = re.compile(r"\.(staging|incoming|old)-|\.tmp-|\.partial|\.lock$")
EXPECTED = {"num_samples": 300, "num_quarantined": 2, "num_classes": 4}


@dataclass(frozen=True)
class Baseline:
    """When each stage starts and how long it lasts in a normal run (seconds)."""

    total: float
    begin: float  # the flow run began (Prefect logged it)
    finished: dict[str, float]  # task -> when its "Finished" line arrived
    asset: Path  # the published asset of the normal run (copied to 'replace' trials)
    size: int = 0  # its size: a .partial this large holds every image (the pack's tail began)

    def window(self, stage: str) -> tuple[str | None, float, float]:
        """``(line that starts it, earliest, latest delay after that line)`` of a stage."""
        f = self.finished
        if stage == "fetch":
            return _BEGIN, 0.0, f["fetch"] - self.begin
        pack = f["pack"] - f["discover"]
        if stage == "preprocess":
            return "Task run 'discover[", 0.0, 0.8 * pack
        if stage == "pack":
            return "Task run 'discover[", 0.8 * pack, pack
        if stage == "verify":
            return "Task run 'pack[", 0.0, f["verify"] - f["pack"]
        if stage == "publish":
            return "Task run 'preview[", 0.0, f["publish"] - f["preview"]
        return None, 0.0, self.total


def _args(src: Path, sha: str, dest: Path, cache: Path, overwrite: bool) -> list[str]:
    return [
        "build",
        str(src),
        str(dest),
        "--sha256",
        sha,
        "--cache-dir",
        str(cache),
        "--smoke-workers",
        "0",
        *(["--overwrite"] if overwrite else []),
    ]


def _finished_times(w: Watched) -> dict[str, float]:
    out = {}
    for t, line in w.lines:
        m = _FINISHED.search(line)
        if m and "Finished in state Completed" in line:
            out.setdefault(m.group(1), t)
    return out


def measure(src: Path, sha: str, work: Path, api_url: str) -> Baseline:
    """Run one normal build and time it."""
    base = work / "baseline"
    shutil.rmtree(base, ignore_errors=True)
    dest = base / "dest" / "demo.h5"
    w = run_cli(_args(src, sha, dest, base / "cache", False), base_env(base, api_url), REPO)
    rc = w.finish(timeout=600)
    total = w.lines[-1][0] if w.lines else 0.0
    if rc != 0:
        raise RuntimeError(f"the normal build failed (exit {rc}):\n{w.text[-3000:]}")
    begin = next(t for t, line in w.lines if _BEGIN in line)
    return Baseline(
        total=total, begin=begin, finished=_finished_times(w), asset=dest, size=dest.stat().st_size
    )


def _partial_size(tmp: Path) -> int:
    """Size of the build's ``.partial`` in its work folder (-1: none)."""
    sizes = [p.stat().st_size for p in tmp.glob("h5forge-build-*/*.h5.partial") if p.exists()]
    return max(sizes, default=-1)


def _observed(w: Watched, at: float, tail: bool) -> str:
    """The stage the kill landed in, from the lines printed before it; inside the pack task,
    ``tail`` says every image was already in the ``.partial`` (pack) or not (preprocess)."""
    lines = [line for t, line in w.lines if t <= at]
    if not any(_BEGIN in line for line in lines):
        return "startup"
    done = [m.group(1) for line in lines if (m := _FINISHED.search(line))]
    nxt = (
        _TASKS[_TASKS.index(done[-1]) + 1]
        if done and done[-1] != "report"
        else ("fetch" if not done else "finishing")
    )
    if nxt == "pack":
        return "pack" if tail else "preprocess"
    if nxt in ("smoke-load", "preview"):
        return "smoke-load/preview"
    return {"report": "finishing"}.get(nxt, nxt)


def check_destination(dest: Path) -> tuple[str, list[str]]:
    """Classify what a (possibly interrupted) publish left at ``dest``; list broken rules."""
    problems: list[str] = []
    folder = dest.parent
    names = sorted(os.listdir(folder)) if folder.exists() else []
    h5s = [n for n in names if n.endswith(".h5")]
    sidecars = [n for n in names if n.endswith(".h5.manifest.json")]
    for m in sidecars:
        if m[: -len(".manifest.json")] not in h5s:
            problems.append(f"sidecar {m} has no file beside it")
    state = "nothing published"
    for name in h5s:
        path = folder / name
        try:
            sidecar = read_sidecar(str(path))
        except FileNotFoundError:
            sidecar = None
        except ValueError as e:
            problems.append(f"{name}: sidecar unreadable: {e}")
            continue
        if sidecar is None:
            state = "file without sidecar (not published)"
            try:
                verify(str(path), sample_fraction=0.05)
            except IntegrityError as e:
                problems.append(f"{name}: uncommitted file is not whole: {e}")
            continue
        size, sha = path.stat().st_size, Location.of(path).sha256()
        if (sidecar["sha256"], sidecar["bytes"]) != (sha, size):
            problems.append(
                f"{name}: TORN: sidecar says {sidecar['sha256']} / "
                f"{sidecar['bytes']} bytes, file is {sha} / {size} bytes"
            )
            state = "TORN"
            continue
        try:
            verify(str(path))
        except IntegrityError as e:
            problems.append(f"{name}: committed but fails verify: {e}")
        state = "asset committed (sidecar matches)"
    return state, problems


def _check_partials(root: Path) -> list[str]:
    """Every leftover ``.partial`` under ``root`` must be refused by verify and the reader."""
    problems = []
    for partial in root.rglob("*.partial"):
        for name, opener in (("verify", verify), ("H5ImageDataset", H5ImageDataset)):
            try:
                opener(str(partial))
                problems.append(f"{name} accepted the leftover {partial}")
            except UnsealedFileError:
                pass
    return problems


def _leftovers(*roots: Path) -> list[str]:
    out = []
    for root in roots:
        if root.exists():
            out += [str(p.relative_to(root)) for p in root.rglob("*") if _LEFTOVER.search(p.name)]
    return sorted(out)


def _bytes_under(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def run_trial(
    k: int,
    stage: str,
    overwrite: bool,
    rng: random.Random,
    base: Baseline,
    src: Path,
    sha: str,
    work: Path,
    api_url: str,
) -> tuple[str, str, list[str], dict]:
    """Kill one build aimed at ``stage``, check, re-run, check. Returns
    ``(observed stage, state after kill, problems, facts)``."""
    trial = work / f"trial-{k:03d}"
    shutil.rmtree(trial, ignore_errors=True)
    dest = trial / "dest" / "demo.h5"
    dest.parent.mkdir(parents=True)
    if overwrite:  # a published asset to replace
        shutil.copy2(base.asset, dest)
        shutil.copy2(str(base.asset) + ".manifest.json", str(dest) + ".manifest.json")
    env = base_env(trial, api_url)
    args = _args(src, sha, dest, trial / "cache", overwrite)
    needle, lo, hi = base.window(stage)
    delay = rng.uniform(lo, max(lo, hi))
    w = run_cli(args, env, REPO)
    start = 0.0 if needle is None else w.wait_for(needle, timeout=300)
    facts: dict = {"aimed": stage, "delay": round(delay, 3)}
    if start is None:  # the build ended (or failed) before the stage began
        rc = w.finish(timeout=300)
        return (
            "missed (run ended)",
            f"exit {rc}",
            []
            if rc == 0
            else [f"trial {k}: the build failed on its own (exit {rc}): {w.text[-800:]}"],
            facts,
        )
    full = int(0.98 * base.size) if base.size else 1 << 62
    if stage == "pack":  # the tail of the pack task: every image is in the .partial
        delay = rng.uniform(0.0, 0.15)
        while (
            w.proc.poll() is None
            and time.perf_counter() - w.t0 < start + 120
            and _partial_size(trial / "tmp") < full
            and not any("Task run 'pack[" in line for _, line in w.lines)
        ):
            time.sleep(0.003)
        start = time.perf_counter() - w.t0
        facts["delay"] = round(delay, 3)
    while time.perf_counter() - w.t0 < start + delay and w.proc.poll() is None:
        time.sleep(0.001)
    at = time.perf_counter() - w.t0
    tail = _partial_size(trial / "tmp") >= full
    exited = w.proc.poll() is not None
    w.kill()
    observed = "after exit" if exited else _observed(w, at, tail)
    state, problems = check_destination(dest)
    problems += _check_partials(trial)
    facts["leftovers_after_kill"] = _leftovers(trial / "cache", trial / "dest", trial / "tmp")
    facts["tmp_bytes_after_kill"] = _bytes_under(trial / "tmp")
    again = run_cli(args, env, REPO)
    rc = again.finish(timeout=600)
    if (
        rc == 2
        and not overwrite
        and state != "nothing published"
        and "already exists" in again.text
    ):
        # The same command without --overwrite refuses a destination that holds a file; what
        # the kill left is checked above, so this is a clear refusal, not a failure.
        facts["rerun"] = "refused: already exists (use --overwrite)"
    elif rc != 0:
        problems.append(
            f"trial {k} ({observed}, {state}): the re-run failed (exit {rc}): {again.text[-600:]}"
        )
    else:
        final, more = check_destination(dest)
        problems += more
        if final != "asset committed (sidecar matches)":
            problems.append(f"trial {k}: after the re-run the destination holds {final}")
        else:
            sidecar = json.loads(Path(str(dest) + ".manifest.json").read_text())
            got = {key: sidecar.get(key) for key in EXPECTED}
            if got != EXPECTED:
                problems.append(f"trial {k}: the re-run published {got}, expected {EXPECTED}")
        left = _leftovers(trial / "cache", trial / "dest")
        if left:
            problems.append(f"trial {k}: leftovers after the re-run: {left}")
    facts["tmp_bytes_after_rerun"] = _bytes_under(trial / "tmp")
    if not problems:
        shutil.rmtree(trial, ignore_errors=True)
    return observed, state, [f"trial {k} ({stage}->{observed}): {p}" for p in problems], facts


def run(
    *,
    trials: int = 36,
    seed: int = 0,
    work: Path,
    api_url: str,
    stages: tuple[str, ...] = STAGES,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """Kill ``trials`` builds, aimed round-robin at ``stages``."""
    t0 = time.perf_counter()
    res = CampaignResult("crash")
    rng = random.Random(seed)
    src = make_demo_archive(work / "source")
    sha = Location.of(src).sha256()
    base = measure(src, sha, work, api_url)
    res.notes.append(
        f"normal build: {base.total:.1f} s from start to exit; task finished at (s after start): "
        + ", ".join(f"{k} {v:.2f}" for k, v in base.finished.items())
    )
    landed: dict[str, int] = {}
    leaked = cleaned = rebuilt = 0
    for k in range(trials):
        stage = stages[k % len(stages)]
        overwrite = (k // len(stages)) % 2 == 1
        observed, state, problems, facts = run_trial(
            k, stage, overwrite, rng, base, src, sha, work, api_url
        )
        landed[observed] = landed.get(observed, 0) + 1
        leaked += int(facts.get("tmp_bytes_after_kill", 0) > 0)
        if facts.get("tmp_bytes_after_kill", 0) > 0 and "rerun" not in facts:
            rebuilt += 1  # the re-run built (was not refused before its flow's first step)
            cleaned += int(facts.get("tmp_bytes_after_rerun", 1) == 0)
        lost = any(
            "TORN" in p or "expected" in p or "accepted" in p or "no file" in p or "not whole" in p
            for p in problems
        )
        res.record(
            f"{observed}: {state}",
            detected=not problems,
            lost=lost,
            problem="\n    ".join(problems) if problems else None,
        )
        log(
            f"  trial {k:2d} aimed {stage:10s} +{facts['delay']:.2f}s -> {observed:18s} "
            f"{state}{' PROBLEMS' if problems else ''}"
        )
    res.notes.append("kills landed in: " + ", ".join(f"{k} {v}" for k, v in sorted(landed.items())))
    res.notes.append(
        f"{leaked} of {trials} kills left a build work folder (with the partial or "
        f"packed file) in TMPDIR; of the {rebuilt} whose re-run built, the re-run "
        f"removed it in {cleaned} (a re-run refused up front, destination already "
        "published without --overwrite, leaves it to the next build)"
    )
    res.seconds = time.perf_counter() - t0
    return res
