"""Build-level trials for campaigns 5 and 6: whole ``h5forge build`` runs (subprocesses) against
one Prefect server, through network faults and racing each other."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from h5forge.demo import make_demo_archive
from tests.fixtures.servers import LoopbackHTTP
from tests.reliability._procs import REPO, base_env, run_cli
from tests.reliability._result import CampaignResult
from tests.reliability.crash import check_destination

__all__ = ["concurrent_builds", "network_builds"]

_SHA = re.compile(r"^sha256:\s+([0-9a-f]{64})", re.M)


def _build(src: str, dest: Path, box: Path, api_url: str, *extra: str) -> list[str]:
    return [
        "build",
        src,
        str(dest),
        "--cache-dir",
        str(box / "cache"),
        "--smoke-workers",
        "0",
        *extra,
    ]


def network_builds(
    api_url: str, work: Path, log: Callable[[str], None] = lambda s: None
) -> Callable[[LoopbackHTTP, bytes, CampaignResult], None]:
    """``h5forge build http://...``: completes through drops and 5xx; a 404 fails cleanly."""

    def run(http: LoopbackHTTP, _archive: bytes, res: CampaignResult) -> None:
        data = make_demo_archive(work / "net-demo").read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        cases = [
            ("drops and 5xx", ["drop", "500", "drop", "503"], 0),
            ("permanent 404", ["404"] * 30, 2),
        ]
        for k, (label, faults, want_rc) in enumerate(cases):
            path = f"/build-{k}/demo.tar.gz"
            http.serve(path, data)
            for f in faults:
                if f == "drop":
                    http.drop(path, after=len(data) // 3)
                else:
                    http.fail(path, status=int(f))
            box = work / f"net-build-{k}"
            shutil.rmtree(box, ignore_errors=True)
            dest = box / "dest" / "demo.h5"
            w = run_cli(
                _build(http.url(path), dest, box, api_url, "--sha256", sha),
                base_env(box, api_url),
                REPO,
            )
            rc = w.finish(timeout=900)
            state, problems = check_destination(dest)
            if rc != want_rc:
                problems.append(f"exit {rc}, expected {want_rc}: {w.text[-800:]}")
            if "Traceback" in w.text:
                problems.append("a traceback was printed")
            if want_rc == 0 and state != "asset committed (sidecar matches)":
                problems.append(f"destination holds {state}")
            if want_rc != 0 and state != "nothing published":
                problems.append(f"failed but the destination holds {state}")
            res.record(
                f"build over http, {label}: exit {rc}, {state}",
                detected=not problems,
                lost="TORN" in state,
                problem=f"build {label}: " + "; ".join(problems) if problems else None,
            )
            log(f"  build over http, {label}: exit {rc}, {state}")
            if not problems:
                shutil.rmtree(box, ignore_errors=True)

    return run


def concurrent_builds(
    api_url: str, work: Path, log: Callable[[str], None] = lambda s: None
) -> Callable[[CampaignResult], None]:
    """Two ``h5forge build`` runs to one destination at once, with and without --overwrite."""

    def run(res: CampaignResult) -> None:
        src = make_demo_archive(work / "race-demo")
        sha = hashlib.sha256(src.read_bytes()).hexdigest()
        for overwrite in (True, False):
            box = work / f"race-build-{int(overwrite)}"
            shutil.rmtree(box, ignore_errors=True)
            dest = box / "dest" / "demo.h5"
            extra = ["--sha256", sha, *(["--overwrite"] if overwrite else [])]
            runs = [
                run_cli(
                    _build(str(src), dest, box, api_url, *extra),
                    base_env(box / f"run-{i}", api_url),
                    REPO,
                )
                for i in range(2)
            ]
            rcs = sorted(r.finish(timeout=900) for r in runs)
            state, problems = check_destination(dest)
            shas = {m.group(1) for r in runs if (m := _SHA.search(r.text))}
            if overwrite or rcs == [0, 0]:
                # Without --overwrite both may succeed only by publishing identical bytes (the
                # second finds its asset already there: unchanged).
                if rcs != [0, 0] or (not overwrite and len(shas) != 1):
                    problems.append(
                        f"exit codes {rcs}, sha256 {sorted(shas)}: "
                        + " | ".join(r.text[-400:] for r in runs)
                    )
            elif rcs != [0, 2] or not any("already exists" in r.text for r in runs):
                problems.append(
                    f"exit codes {rcs}, expected one 0 and one 2 (already exists): "
                    + " | ".join(r.text[-400:] for r in runs)
                )
            if any("Traceback" in r.text for r in runs):
                problems.append("a traceback was printed")
            if state != "asset committed (sidecar matches)":
                problems.append(f"destination holds {state}")
            label = "both --overwrite" if overwrite else "no --overwrite"
            if not overwrite and rcs == [0, 0]:
                label += " (identical bytes: the second found it unchanged)"
            res.record(
                f"two builds at once, {label}: exits {rcs}, {state}",
                detected=not problems,
                lost="TORN" in state,
                problem=f"two builds, {label}: " + "; ".join(problems) if problems else None,
            )
            log(f"  two builds at once, {label}: exits {rcs}, {state}")
            if not problems:
                shutil.rmtree(box, ignore_errors=True)

    return run
