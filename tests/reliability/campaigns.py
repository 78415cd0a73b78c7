"""Run the reliability campaigns and record their figures in docs/RELIABILITY.md.

Usage::

    python -m tests.reliability.campaigns                      # every campaign, full size
    python -m tests.reliability.campaigns --campaign crash --trials 36
    python -m tests.reliability.campaigns --campaign corruption --campaign archives

Each campaign prints its summary; the table in ``docs/RELIABILITY.md`` (between the
``reliability-table`` markers) gets one row per campaign run, and its "last run" block (between
that campaign's ``details`` markers) the outcome breakdown. Rows of campaigns not run are kept.
Exit status 1 when any campaign lost data or broke a requirement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.reliability._procs import REPO, prefect_server
from tests.reliability._result import CampaignResult

__all__ = ["CAMPAIGNS", "main", "update_doc"]

CAMPAIGNS = (
    "crash",
    "corruption",
    "hostile",
    "archives",
    "network",
    "concurrency",
    "hostile-h5",
    "first-run",
)
DOC = REPO / "docs" / "RELIABILITY.md"
_NEEDS_PREFECT = ("crash", "network", "concurrency")
_LABEL = {
    "crash": "1. crash safety (SIGKILL `h5forge build`)",
    "corruption": "2. corruption (byte flips, truncation)",
    "hostile": "3. hostile and odd input",
    "archives": "4. archives and paths",
    "network": "5. network faults (HTTP, S3)",
    "concurrency": "6. concurrency (publishers, readers, re-verify)",
    "hostile-h5": "7. hostile .h5 assets",
    "first-run": "8. first contact (fresh PREFECT_HOME, busy cores, kill -9 + re-run)",
}


def _log(text: str) -> None:
    print(text, flush=True)


def _run_one(
    name: str, trials: int | None, seed: int, work: Path, api_url: str | None, builds: bool
) -> CampaignResult:
    box = work / name
    box.mkdir(parents=True, exist_ok=True)
    if name == "crash":
        from tests.reliability import crash

        assert api_url is not None
        return crash.run(trials=trials or 30, seed=seed, work=box, api_url=api_url, log=_log)
    if name == "corruption":
        from tests.reliability import corruption

        n = trials or 600
        return corruption.run(trials=n, truncations=max(20, n // 5), seed=seed, work=box, log=_log)
    if name == "hostile":
        from tests.reliability import hostile

        return hostile.run(fuzz_examples=trials or 300, work=box, log=_log)
    if name == "archives":
        from tests.reliability import archive_attacks

        return archive_attacks.run(work=box, log=_log)
    if name == "network":
        from tests.reliability import builds as b
        from tests.reliability import network

        n = trials or 120
        build = b.network_builds(api_url, box, _log) if builds and api_url else None
        return network.run(
            http_trials=n, s3_trials=max(4, n // 10), seed=seed, work=box, build=build, log=_log
        )
    if name == "concurrency":
        from tests.reliability import builds as b
        from tests.reliability import concurrency

        race = b.concurrent_builds(api_url, box, _log) if builds and api_url else None
        return concurrency.run(trials=trials or 30, seed=seed, work=box, builds=race, log=_log)
    if name == "hostile-h5":
        from tests.reliability import hostile_h5

        return hostile_h5.run(work=box, log=_log)
    if name == "first-run":
        from tests.reliability import first_run

        n = trials or 5
        return first_run.run(busy=n, kills=2 * n, seed=seed, work=box, log=_log)
    raise ValueError(f"unknown campaign {name!r}; one of {CAMPAIGNS}")


def _command(name: str, trials: int | None) -> str:
    extra = f" --trials {trials}" if trials else ""
    return f"`python -m tests.reliability.campaigns --campaign {name}{extra}`"


def _row(res: CampaignResult, command: str) -> str:
    return f"| {_LABEL[res.name]} | {res.trials} | {res.detected} | {res.lost} | {command} |"


def _details(res: CampaignResult, when: str) -> str:
    lines = [f"Last run: {when}, {res.seconds:.0f} s, {'PASSED' if res.ok else 'FAILED'}.", ""]
    lines += ["| outcome | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(res.outcomes.items()) if v]
    if res.notes:
        lines += [""] + [f"- {n}" for n in res.notes]
    if res.problems:
        lines += ["", "Problems:"] + [f"- {p}" for p in res.problems[:40]]
    return "\n".join(lines)


def update_doc(results: list[tuple[CampaignResult, str]], doc: Path = DOC) -> None:
    """Replace the rows and the detail blocks of the campaigns in ``results``."""
    text = doc.read_text(encoding="utf-8")
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    start, end = "<!-- reliability-table:start -->", "<!-- reliability-table:end -->"
    head, rest = text.split(start, 1)
    table, tail = rest.split(end, 1)
    rows = {}
    for line in table.strip().splitlines()[2:]:
        for name, label in _LABEL.items():
            if line.startswith(f"| {label} |"):
                rows[name] = line
    for res, command in results:
        rows[res.name] = _row(res, command)
    body = [
        "| campaign | trials | failures detected | data lost | command |",
        "|---|---|---|---|---|",
        *(rows[n] for n in CAMPAIGNS if n in rows),
    ]
    text = head + start + "\n" + "\n".join(body) + "\n" + end + tail
    for res, _ in results:
        a, b = f"<!-- details:{res.name}:start -->", f"<!-- details:{res.name}:end -->"
        block = f"{a}\n{_details(res, f'{when} on {machine}')}\n{b}"
        if a in text:
            before, _, after = text.partition(a)
            text = before + block + after.partition(b)[2]
        else:
            text += "\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _maybe_prefect(work: Path, needed: bool) -> Iterator[str | None]:
    if not needed:
        yield None
        return
    with prefect_server(work / "prefect") as (url, seconds):
        _log(f"prefect server healthy after {seconds:.1f} s at {url}")
        yield url


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the campaigns, update the document; 0 when all passed."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.campaigns", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--campaign",
        action="append",
        choices=CAMPAIGNS,
        help="run this campaign (repeatable); default: all",
    )
    parser.add_argument(
        "--trials",
        type=int,
        default=None,
        help="main trial count of each campaign run (default: its full size)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: temp)")
    parser.add_argument(
        "--no-builds",
        action="store_true",
        help="skip the build-level trials of the network and concurrency campaigns",
    )
    parser.add_argument("--no-doc", action="store_true", help="do not update RELIABILITY.md")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the Prefect server and every child get stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = args.campaign or list(CAMPAIGNS)
    results: list[tuple[CampaignResult, str]] = []
    with contextlib.ExitStack() as stack:
        work = args.work or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="h5forge-reliability-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        needs = any(n == "crash" or (n in _NEEDS_PREFECT and not args.no_builds) for n in names)
        api_url = stack.enter_context(_maybe_prefect(work, needs))
        for name in names:
            _log(f"== {name}")
            t0 = time.perf_counter()
            res = _run_one(name, args.trials, args.seed, work, api_url, not args.no_builds)
            res.seconds = res.seconds or time.perf_counter() - t0
            _log(res.summary())
            for note in res.notes:
                _log(f"  {note}")
            results.append((res, _command(name, args.trials)))
    if not args.no_doc:
        update_doc(results)
        _log(f"updated {DOC}")
    failed = [r.name for r, _ in results if not r.ok]
    if failed:
        _log(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
